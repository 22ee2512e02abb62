"""The analysis indexes kept under ``TRACEDPUSH_INDEX_ROOT``: what each holds, and which
can go (`tracedpush index`).

An index is a cache: deleting one costs only the cold build the next `report` or
console of its traces does again. Nothing here deletes a file it does not know: an
index directory loses the index's own files (its databases and kept pickles) and goes
only if that leaves it empty; any other directory under the root is left alone.

Which indexes are worth nothing as they stand (``prune``'s default):
* their trace files are all gone (nothing can open them again);
* made by another version of the analysis, or other tuning values: opening one under
  this code deletes it and builds from nothing (`AnalysisIndex.build_reason`);
* a build that never finished (no state saved), not written to for `INCOMPLETE_AFTER_S`.
An index that a process has open (a console following a run, a build in progress) is
never removed: on this host Linux's ``/proc`` says which; on other hosts sharing the
root, and where there is no ``/proc``, the lease each such process writes in the index
(`index_lease`).

With ``TRACEDPUSH_INDEX_MAX_SIZE`` set, the root is kept under that size without anyone
running ``prune``: each index built there removes, as it ends, the worthless ones and
then the least recently used others until the root fits (`keep_under_cap`), never
itself; so does an update that grows one (`after_growth`).
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracedpush import envs, pids
from tracedpush.analysis import index_lease
from tracedpush.analysis.index import _DB, INDEX_DIRNAME, format_key, own_files

# an index without a saved state, untouched this long, is a build that died
INCOMPLETE_AFTER_S = 3600.0
PROC = Path("/proc")  # Linux's: which process has which file open (`in_use`)

OK = "ok"
MISSING = "traces gone"
OTHER_VERSION = "other version"
INCOMPLETE = "incomplete"
BUILDING = "building"  # no state yet, written to lately
UNREADABLE = "unreadable"


@dataclass
class IndexInfo:
    """One index directory: its size on disk, when it was last used, what it covers."""

    path: Path
    bytes: int
    last_used: float  # seconds since the epoch: its files' newest mtime (a warm open stamps
    # its database: `AnalysisIndex._load_state`)
    status: str  # OK, MISSING, OTHER_VERSION, INCOMPLETE, BUILDING or UNREADABLE
    paths: list[str] = field(default_factory=list)  # the trace paths it indexes
    traces: int = 0
    # the processes with it open: this host's from /proc, the others' from their leases
    in_use_by: list[index_lease.User] = field(default_factory=list)

    @property
    def missing_paths(self) -> list[str]:
        return [p for p in self.paths if not os.path.exists(p)]


def is_index(directory: Path) -> bool:
    return (directory / _DB).is_file()


def describe(directory: Path, now: float | None = None) -> IndexInfo:
    """What the index in `directory` holds, read without changing it."""
    files = own_files(directory)
    size = sum(_disk_bytes(f) for f in files)
    # a reader's -shm or -wal is no use: not theirs (nor the directory's) mtime
    used = max((_mtime(f) for f in files if not f.name.endswith(("-shm", "-wal"))), default=0)
    info = IndexInfo(directory, size, used, UNREADABLE)
    fresh = (time.time() if now is None else now) - info.last_used < INCOMPLETE_AFTER_S
    try:
        row = _state_row(directory / _DB)
    except sqlite3.DatabaseError:  # torn, or another process's write under way
        info.status = BUILDING if fresh else UNREADABLE
        return info
    if row is None:
        info.status = BUILDING if fresh else INCOMPLETE  # under way, or one that died
        return info
    try:
        fmt, state = pickle.loads(row)
        info.paths = list(state.paths)
        info.traces = int(state.next_seq)
    except Exception:  # a torn row, or a state class of other code: unusable either way
        return info
    if fmt != format_key():
        info.status = OTHER_VERSION
    elif info.paths and len(info.missing_paths) == len(info.paths):
        info.status = MISSING
    else:
        info.status = OK
    return info


def scan(root: Path) -> list[IndexInfo]:
    """Every index directly under `root`, least recently used first."""
    if not root.is_dir():
        return []
    found = [describe(d) for d in sorted(root.iterdir()) if d.is_dir() and is_index(d)]
    users = in_use([i.path for i in found])
    for i in found:
        i.in_use_by = users.get(i.path, [])
    return sorted(found, key=lambda i: i.last_used)


def in_use(directories: Sequence[Path]) -> dict[Path, list[index_lease.User]]:
    """The processes with one of `directories` open: on this host, from ``/proc``
    (Linux, and the processes this user may look into); on other hosts, and on this one
    where ``/proc`` does not show them, from the leases the processes write in the index
    (`index_lease`)."""
    wanted = {str(d.resolve()) + os.sep: d for d in directories}
    out: dict[Path, list[index_lease.User]] = {}
    proc = PROC if PROC.is_dir() else None
    for pid_dir in proc.iterdir() if proc is not None and wanted else ():
        if not pid_dir.name.isdigit() or pid_dir.name == str(os.getpid()):
            continue
        links = pids.open_files(pid_dir)
        for prefix, d in wanted.items():
            if any(link.startswith(prefix) for link in links):
                out.setdefault(d, []).append(index_lease.User(int(pid_dir.name), _command(pid_dir)))
    for d in directories:  # (this host's: those /proc did not show, another user's)
        seen = {u.pid for u in out.get(d, [])}
        for who in index_lease.holders(d, skip_pids=seen):
            out.setdefault(d, []).append(who)
    return out


def select(
    infos: Iterable[IndexInfo],
    *,
    everything: bool = False,
    older_than_s: float | None = None,
    max_bytes: int | None = None,
    now: float | None = None,
    cap_name: str = "--max-size",
) -> list[tuple[IndexInfo, str]]:
    """The indexes to remove, each with why: the worthless ones (module docstring),
    those unused for `older_than_s`, then the least recently used until the rest fit in
    `max_bytes` (`cap_name` in the why); or all (`everything`). Never one a process has
    open."""
    now = time.time() if now is None else now
    chosen: list[tuple[IndexInfo, str]] = []
    kept: list[IndexInfo] = []
    for i in sorted(infos, key=lambda i: i.last_used):
        why = _why(i, everything, older_than_s, now)
        if why and not i.in_use_by:
            chosen.append((i, why))
        else:
            kept.append(i)
    if max_bytes is not None:
        total = sum(i.bytes for i in kept)
        for i in list(kept):  # least recently used first
            if total <= max_bytes:
                break
            if i.in_use_by:
                continue
            chosen.append((i, f"over {cap_name} ({human_bytes(total)} kept)"))
            total -= i.bytes
    return chosen


def max_size() -> int | None:
    """``TRACEDPUSH_INDEX_MAX_SIZE`` in bytes, None when unset (ValueError naming the
    variable when it does not parse: the commands check it as they start)."""
    text = envs.env_str(envs.INDEX_MAX_SIZE)
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"{envs.INDEX_MAX_SIZE}={text!r}: {exc}") from None


def cap_of(root: Path) -> int | None:
    """The size the builds keep directory `root` (resolved) under: ``TRACEDPUSH_INDEX_MAX_SIZE``
    when `root` is ``TRACEDPUSH_INDEX_ROOT``, else None (an index beside its traces or
    in --index-dir is not the root's); ValueError as `max_size`. `tracedpush index list`
    shows it."""
    env_root = envs.env_str(envs.INDEX_ROOT)
    if env_root is None or Path(env_root).expanduser().resolve() != root:
        return None
    return max_size()


CAP_EVERY_S = 60.0  # a console's Live refreshes check the root's cap at most this often


def keep_under_cap(current: Path) -> list[tuple[IndexInfo, str, int]]:
    """After index `current` was built or grew: when its directory's root has a cap
    (`cap_of`), remove what ``prune --max-size`` would (the worthless, then the least
    recently used until the root fits), never `current` nor one in use; each removed
    index, why, and the bytes freed."""
    here = current.resolve()
    cap = cap_of(here.parent)
    if cap is None:
        return []
    infos = scan(here.parent)
    for i in infos:
        if i.path.resolve() == here:
            i.in_use_by = i.in_use_by or [index_lease.User(os.getpid(), "(this build)")]
    cap_name = f"{envs.INDEX_MAX_SIZE}={human_bytes(cap)}"
    return [(i, why, remove(i)) for i, why in select(infos, max_bytes=cap, cap_name=cap_name)]


def after_growth(current: Path, say: Callable[[str], None]) -> None:
    """`keep_under_cap` as a build of `current` ends, or after an update grew it (a
    report's; a console's Live refresh, at most once a `CAP_EVERY_S`), each removal (or
    why none could be made) said through `say`; never raises: the index is good."""
    try:
        gone = keep_under_cap(current)
    except (OSError, sqlite3.Error, ValueError) as exc:
        say(f"the indexes under ${envs.INDEX_ROOT} were not kept under the cap: {exc}")
        return
    for info, why, freed in gone:
        say(f"removed the index {info.path} ({why}; {human_bytes(freed)})")


def remove(info: IndexInfo) -> int:
    """Delete the index's own files, and its directory if that leaves it empty; the
    bytes freed. Another process's files in it stay (and so does the directory)."""
    freed = 0
    for f in own_files(info.path) + index_lease.files(info.path):  # leases: of the dead
        freed += _disk_bytes(f)
        f.unlink(missing_ok=True)
    try:
        info.path.rmdir()
    except OSError:  # something else lives there: not ours to delete
        pass
    return freed


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def parse_size(text: str) -> int:
    """ "50G", "500MB", "2.5T", "1000" (bytes) -> bytes (powers of 1000, as `du --si`)."""
    s = text.strip().upper().removesuffix("B")
    scale = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    factor = 1.0
    if s and s[-1] in scale:
        factor, s = scale[s[-1]], s[:-1]
    try:
        value = float(s) * factor
    except ValueError:
        raise ValueError(f"bad size {text!r} (use e.g. 500M, 50G, 1T)") from None
    if value < 0:
        raise ValueError(f"bad size {text!r}: negative")
    return int(value)


def age_words(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.0f}{unit} ago"
    return "just now"


def _why(i: IndexInfo, everything: bool, older_than_s: float | None, now: float) -> str:
    if everything:
        return "--all"
    if i.status in (MISSING, OTHER_VERSION, INCOMPLETE, UNREADABLE):
        return i.status
    if older_than_s is not None and now - i.last_used > older_than_s:
        return f"unused for {age_words(now - i.last_used).removesuffix(' ago')}"
    return ""


def _state_row(db_path: Path) -> bytes | None:
    """The saved state's row, read-only (a reader never switches or checkpoints it).
    Without a WAL file everything is in the database itself: read as immutable, which
    leaves no -shm or -wal behind."""
    wal = db_path.with_name(db_path.name + "-wal").exists()
    mode = "mode=ro" if wal else "mode=ro&immutable=1"
    db = sqlite3.connect(f"file:{db_path}?{mode}", uri=True)
    try:
        row = db.execute("SELECT v FROM meta WHERE k = 'state'").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    finally:
        db.close()
    return None if row is None else bytes(row[0])


def _disk_bytes(f: Path) -> int:
    try:
        st = f.stat()
    except OSError:
        return 0
    return min(st.st_size, st.st_blocks * 512) if hasattr(st, "st_blocks") else st.st_size


def _mtime(f: Path) -> float:
    try:
        return f.stat().st_mtime
    except OSError:
        return 0.0


def _command(pid_dir: Path) -> str:
    try:
        raw = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").strip()
    except OSError:
        return "?"
    return raw.decode(errors="replace")[:80]


def dirs_of(paths: Sequence[str]) -> Iterator[Path]:
    """The index directories `paths` name: an index directory itself, or a directory of
    traces with its ``.tracedpush-index`` beside them."""
    for p in map(Path, paths):
        if is_index(p):
            yield p
        elif is_index(p / INDEX_DIRNAME):
            yield p / INDEX_DIRNAME
        else:
            raise FileNotFoundError(f"{p}: not an analysis index (no {_DB} in it)")
