"""`tracedpush index`: list and prune the analysis indexes kept under
``TRACEDPUSH_INDEX_ROOT`` (as ``pip cache`` does for pip's cache).

An index is a cache of a run's analysis (`analysis.index`): removing one costs only the
cold build of its traces' next `report` or console. See `index_cache` for which are
worth nothing as they stand, and for what a removal touches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tracedpush import envs
from tracedpush.analysis import index_cache as cache
from tracedpush.analysis.jaeger import parse_duration

EPILOG = f"""The indexes are those `tracedpush report` and `tracedpush console` keep under
${envs.INDEX_ROOT} (a directory per set of trace paths). Without that variable an index
lives beside its traces, in .tracedpush-index/: `tracedpush index remove TRACES_DIR`
removes it.

Removing an index loses nothing but time: the next report or console of its traces
builds it again. Only the index's own files are deleted; an index a process has open
(a console following a run, a build under way) is never removed: on this host /proc
says which; another host's process sharing the root says so by the lease it keeps in
the index (lease-<host>-<pid>, touched as it updates and at least hourly, counted
three hours after its last touch).
With ${envs.INDEX_MAX_SIZE} set (e.g. 50G), every build under the root, and every
update that grows an index there, prunes it to that size (as `prune --max-size`),
never the index it made.

examples:
  tracedpush index list
  tracedpush index prune                      # traces gone, other version, dead builds
  tracedpush index prune --older-than 14d --max-size 50G --dry-run
  tracedpush index remove /var/cache/tracedpush/run1-0123456789ab
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    root_help = (
        f"the directory of indexes (default: ${envs.INDEX_ROOT}, "
        f"now {envs.env_str(envs.INDEX_ROOT) or 'unset'})"
    )

    ls = sub.add_parser("list", help="each index: last used, size, traces, status")
    ls.add_argument("--root", metavar="DIR", help=root_help)
    ls.add_argument("--json", action="store_true", help="one JSON document on stdout")

    prune = sub.add_parser(
        "prune",
        help="remove the indexes that are worth nothing as they stand (their traces are "
        "gone, made by another version of the analysis, builds that died), and those "
        "--older-than or beyond --max-size",
    )
    prune.add_argument("--root", metavar="DIR", help=root_help)
    prune.add_argument(
        "--older-than",
        metavar="AGE",
        type=_age,
        help="also remove indexes not used for AGE (e.g. 12h, 14d)",
    )
    prune.add_argument(
        "--max-size",
        metavar="SIZE",
        type=_size,
        help="then remove the least recently used until the rest take SIZE at most "
        "(e.g. 500M, 50G)",
    )
    prune.add_argument("--all", action="store_true", help="remove every index not in use")
    prune.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")

    rm = sub.add_parser(
        "remove", help="remove the given indexes (an index directory, or a traces directory)"
    )
    rm.add_argument("paths", nargs="+", metavar="PATH")
    rm.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")


def run(args: argparse.Namespace) -> int:
    if args.action == "remove":
        return _remove(args)
    if args.action not in ("list", "prune"):
        print("tracedpush index: give an action: list, prune or remove (see --help)",
              file=sys.stderr)  # fmt: skip
        return 2
    root = _root(args)
    if root is None:
        return 2
    return (_list if args.action == "list" else _prune)(args, root, cache.scan(root))


def _list(args: argparse.Namespace, root: Path, infos: list[cache.IndexInfo]) -> int:
    try:
        cap = cache.cap_of(root)
    except ValueError as exc:
        print(f"tracedpush index: {exc}", file=sys.stderr)
        return 2
    if args.json:
        doc = {"root": str(root), "max_size": cap, "indexes": [_doc(i) for i in infos]}
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    if not infos:
        print(f"no analysis indexes under {root}")
        return 0
    now = time.time()
    rows = [("last used", "size", "traces", "status", "index (traces)")]
    for i in infos:
        rows.append(
            (
                cache.age_words(now - i.last_used),
                cache.human_bytes(i.bytes),
                f"{i.traces:,}" if i.paths else "",
                _status(i),
                f"{i.path}  ({_paths(i)})" if i.paths else str(i.path),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in range(4)) + "  " + r[4])
    capped = f" (kept under {cache.human_bytes(cap)}: ${envs.INDEX_MAX_SIZE})" if cap else ""
    print(f"{_count(infos)} under {root}{capped}")
    return 0


def _prune(args: argparse.Namespace, root: Path, infos: list[cache.IndexInfo]) -> int:
    chosen = cache.select(
        infos, everything=args.all, older_than_s=args.older_than, max_bytes=args.max_size
    )
    gone = {id(i) for i, _ in chosen}
    freed = 0
    for i, why in chosen:
        freed += i.bytes if args.dry_run else cache.remove(i)
        verb = "would remove" if args.dry_run else "removed"
        print(f"{verb} {i.path} ({cache.human_bytes(i.bytes)}): {why}")
    for i in infos:
        if i.in_use_by and id(i) not in gone:
            print(f"kept {i.path}: in use by {'; '.join(map(str, i.in_use_by))}")
    left = [i for i in infos if id(i) not in gone]
    verb = "would free" if args.dry_run else "freed"
    print(f"{verb} {cache.human_bytes(freed)}; left: {_count(left)} under {root}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    try:
        dirs = list(cache.dirs_of(args.paths))
    except FileNotFoundError as exc:
        print(f"tracedpush index: {exc}", file=sys.stderr)
        return 1
    users = cache.in_use(dirs)
    busy = 0
    for d in dirs:
        info = cache.describe(d)
        if users.get(d):
            busy += 1
            print(f"not removed {d}: in use by {'; '.join(map(str, users[d]))}", file=sys.stderr)
            continue
        size = info.bytes if args.dry_run else cache.remove(info)
        print(f"{'would remove' if args.dry_run else 'removed'} {d} ({cache.human_bytes(size)})")
    return 1 if busy else 0


def _count(infos: list[cache.IndexInfo]) -> str:
    n = len(infos)
    return f"{n} index{'es' if n != 1 else ''}, {cache.human_bytes(sum(i.bytes for i in infos))}"


def _root(args: argparse.Namespace) -> Path | None:
    root = args.root or envs.env_str(envs.INDEX_ROOT)
    if not root:
        print(
            f"tracedpush index: no directory of indexes: set ${envs.INDEX_ROOT} or give "
            "--root DIR (an index beside its traces goes with `tracedpush index remove "
            "TRACES_DIR`)",
            file=sys.stderr,
        )
        return None
    path = Path(root).expanduser().resolve()
    if not path.is_dir():
        print(f"tracedpush index: {path}: no such directory", file=sys.stderr)
        return None
    return path


def _status(i: cache.IndexInfo) -> str:
    if i.in_use_by:
        return f"{i.status}, in use ({i.in_use_by[0].who})"
    if i.status == cache.OK and i.missing_paths:
        return f"ok, {len(i.missing_paths)} of {len(i.paths)} paths gone"
    return i.status


def _paths(i: cache.IndexInfo) -> str:
    more = f" and {len(i.paths) - 1} more" if len(i.paths) > 1 else ""
    return i.paths[0] + more


def _doc(i: cache.IndexInfo) -> dict:
    return {
        "path": str(i.path),
        "bytes": i.bytes,
        "last_used": i.last_used,
        "status": i.status,
        "traces": i.traces,
        "paths": i.paths,
        "missing_paths": i.missing_paths,
        "in_use_by": [str(u) for u in i.in_use_by],
    }


def _age(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _size(text: str) -> int:
    try:
        return cache.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
