"""Two revisions of the analysis side by side on one run, in A B B A order, with the
ratio B / A: how a change to `report` or `compare` is measured before it is claimed
(this machine's speed drifts within minutes, so only a side-by-side run compares).

Each side is a git checkout (``git worktree add --detach``, removed afterwards; ``.``
is the working tree, uncommitted changes included) run with its own `tracedpush` first
on the path, and with its own index directory: the index's digest covers the analysis
code, so a side never reads what the other built. Name a commit, not ``.``, for a side
whose code may change while this runs (``.`` sees edits in progress). The stages:

* ``warm``: ``tracedpush report --format table`` with the index warm (each side builds
  its index once first, not timed);
* ``json``: the same with ``--format json``;
* ``perfetto``: the same with ``--format perfetto`` (the whole run's trace-event file);
* ``compare``: `compare()` alone, in a process that opened the warm index (each
  measurement the mean of its ``--calls`` calls);
* ``cold``: ``tracedpush report --index`` building the index from nothing (the index
  is deleted before each measurement);
* ``console``: the console's server-side work, in a process that opens the side's warm
  index as ``tracedpush console --index-dir`` does (``load_s``, not in the figure), runs
  its warm-up (``derived.warm``, ``warm_s``), one page untimed (imports), then each
  page's first script run for a new session (Streamlit's AppTest: every figure built and
  serialised, as bench_console.py's AppTest rows); the figure is the pages' sum, each
  page's time is kept (``pages_s``) and printed. What the pages show (their texts, with
  what the Live page says of now, its time of refresh and how long ago the newest
  request came, and the side's index directory masked; each table's rows and each
  chart's traces, counted) is the output compared. Needs a side whose console
  takes ``--index-dir`` (from 2026-12-05); no browser (bench_console.py times Chromium);
* ``live``: a Live refresh, the console's: a process opens a warm index of the run
  and an empty directory beside it, then appends slices of a later synthetic run
  (+60, +240, +2,040 requests, with their engine steps; ``--live-slices 60x20``: twenty
  of +60, a console left open, which reaches the merge of the index's kept segments)
  to that directory and times
  `update(reanalyse_at_most=index.LIVE_REANALYSE)` after each (the stage's figure: their
  sum), then one more with nothing new (``pause``: where a Live index writes its engine
  steps, with their summary and contention). Each side's index of the run is built
  once; each measurement starts from a copy of it, so A and B follow the same appends
  from the same state. What each update did (spans added, requests analysed again and
  left behind, the clock offsets) is kept beside its time and printed: where a side's
  extra time goes.

Each measurement runs in its own process: wall time, CPU time (``wait4``: the process
and its build workers) and peak RSS, as benchmarks/bench_report.py measures them. The
outputs of A and B are compared byte for byte: a change that is faster but reports
something else says so. Printed and written to docs/benchmarks/abba.json (``--out``).

    python benchmarks/bench_abba.py --a HEAD --b .                   # 10,000 synthetic requests
    python benchmarks/bench_abba.py --a main~2 --b main --traces /tmp/run200k --stage compare
    python benchmarks/bench_abba.py --a main~1 --b main --traces /tmp/run200k --stage live
    python benchmarks/bench_abba.py --a main~1 --b . --traces /tmp/run200k --stage console
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_console import PAGES, _write_traces  # the console bench's pages and run
from bench_report import _REPORT, _calibration_s, _end_s, _sliced, measure

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "abba.json"
STAGES = ("warm", "json", "perfetto", "compare", "cold", "live", "console")
_WARM_INDEX = ("warm", "json", "perfetto", "compare", "console")  # stages on the side's warm index
LIVE_SLICES = (60, 240, 2_040)  # requests per append of the ``live`` stage
WORKING_TREE = "."

# Run a checkout's own tracedpush: first on the path, and without the editable install's
# finder (it maps tracedpush.console to this repository's console/, whatever the checkout);
# the checkout's console/ is its tracedpush.console (pyproject's package-dir mapping).
_AT = """import importlib.util, sys
code = sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(getattr(f, "__module__", ""))]
sys.path.insert(0, code)
import tracedpush
if not tracedpush.__file__.startswith(code):
    sys.exit(f"tracedpush imported from {tracedpush.__file__}, not from {code}")
_spec = importlib.util.spec_from_file_location(
    "tracedpush.console", f"{code}/console/__init__.py",
    submodule_search_locations=[f"{code}/console"])
sys.modules["tracedpush.console"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["tracedpush.console"])
"""

# `compare()` alone on a warm index: argv traces, index dir, output file, calls
_COMPARE = """import json, sys, time
from tracedpush.analysis.compare import compare
from tracedpush.analysis.index import AnalysisIndex
traces, index_dir, out, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
run = AnalysisIndex([traces], index_dir=index_dir).update()
took = []
for _ in range(calls):
    t0 = time.perf_counter()
    got = compare(run)
    took.append(time.perf_counter() - t0)
with open(out, "w") as fh:
    json.dump(got.to_json(), fh, sort_keys=True)
"""

# The ``console`` stage in a side's process: argv traces, index dir, output file, pages
# (JSON: name -> AppTest page path or null for the first page). The app reads its source
# from sys.argv, as `tracedpush console --traces DIR --index-dir DIR` passes it.
_CONSOLE = """import json, re, sys, time
from pathlib import Path
traces, index_dir, out, pages = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
index_dir = str(Path(index_dir).resolve())  # as the app shows it
sys.argv = ["app.py", "--traces", traces, "--index-dir", index_dir]
from tracedpush.console import data, derived
from tracedpush.console.source import Source, from_args
if "index_dir" not in Source.__dataclass_fields__:
    sys.exit("this revision's console takes no --index-dir: the console stage needs it")
from streamlit.testing.v1 import AppTest
app = str(Path(data.__file__).with_name("app.py"))
t0 = time.perf_counter()
snap = data.feed(from_args(sys.argv[1:])).snapshot()
load = time.perf_counter() - t0
t0 = time.perf_counter()
derived.warm(snap)
warm = time.perf_counter() - t0
AppTest.from_file(app, default_timeout=600).run()  # imports: no page pays them
def mask(text):  # the Live page's "now" is the clock's, the index dir the side's
    text = re.sub(r"refreshed \\d\\d:\\d\\d:\\d\\d", "refreshed HH:MM:SS", text)
    return re.sub(r"[\\d,.]+ (min|s|h) ago", r"N \\1 ago", text.replace(index_dir, "INDEX_DIR"))
def shown(at):
    texts = [mask(str(e.value)) for kind in ("title", "header", "subheader", "markdown",
             "caption", "info", "warning", "error", "metric") for e in at.get(kind)]
    charts = [len(json.loads(e.proto.spec)["data"]) for e in at.get("plotly_chart")]
    rows = [len(e.value) for e in at.get("dataframe")]
    return {"texts": texts, "chart_traces": charts, "table_rows": rows}
pages_s, what = {}, {}
for name, page in pages.items():
    at = AppTest.from_file(app, default_timeout=600)
    if page is not None:
        at.run()  # st.navigation needs one run before switching pages
        at.switch_page(page)
    t0 = time.perf_counter()
    at.run()
    pages_s[name] = time.perf_counter() - t0
    if at.exception:
        sys.exit(f"{name}: {at.exception[0].value}")
    what[name] = shown(at)
with open(out, "w") as fh:
    json.dump(what, fh, sort_keys=True)
took = {"load_s": load, "warm_s": warm, "pages_s": pages_s}
"""

# The end of a script that timed calls inside its process (`took`): the times beside
# the output, and the peak RSS on stderr, as `bench_report.measure` reads it
_TOOK = """with open(out + ".took", "w") as fh:
    json.dump(took, fh)
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print("VmHWM", int(line.split()[1]), file=sys.stderr)
"""


# The ``live`` stage in a side's process: argv traces, the appends' directory, index
# dir, slices file, output file. Opens the index (not timed), then appends each slice
# and times the update after it, as the console's Live refresh updates; what each update
# did (spans added, requests analysed again or left behind, the clock offsets) goes to
# ``<out>.did``, beside the output: why one side's update takes longer.
_LIVE = """import json, sys, time
from pathlib import Path
from tracedpush.analysis.compare import compare
from tracedpush.analysis.index import LIVE_REANALYSE, AnalysisIndex
traces, grow, index_dir, slices, out = sys.argv[1:6]
idx = AnalysisIndex([traces, grow], index_dir=index_dir)
idx.update()
took, did = [], []
for part in [*json.loads(Path(slices).read_text()), {}]:  # the last: nothing new, a pause
    for name, lines in part.items():
        f = Path(grow) / name
        f.parent.mkdir(parents=True, exist_ok=True)
        with f.open("a") as fh:
            fh.write("\\n".join(lines) + "\\n")
    t0 = time.perf_counter()
    run = idx.update(reanalyse_at_most=LIVE_REANALYSE)
    took.append(time.perf_counter() - t0)
    did.append({"new_spans": idx.last_new, "reanalysed": idx.last_reanalysed,
                "tpot_redone": idx.last_tpot_redone, "behind": idx.behind,
                "steps": idx.last_steps, "steps_written": not idx._steps_unsaved,
                "offsets_ms": {
                    k: round(o.offset_ms, 4) for k, o in sorted(run.clock_offsets.items())}})
with open(out, "w") as fh:
    json.dump({"compare": compare(run).to_json(), "requests": len(run.requests)}, fh,
              sort_keys=True)
with open(out + ".did", "w") as fh:
    json.dump(did, fh)
idx.close()
"""

# A side's index of the run and the (empty) appends' directory: argv traces, grow, index
_BUILD_LIVE = """import sys
from tracedpush.analysis.index import AnalysisIndex
idx = AnalysisIndex(sys.argv[1:3], index_dir=sys.argv[3])
idx.update()
idx.close()
"""


@dataclass
class Live:
    """The ``live`` stage's inputs: the slices to append (a JSON file) and where."""

    slices: Path
    grow: Path


@dataclass
class Side:
    """One revision: where its code is checked out, and its index and outputs."""

    name: str  # "A" or "B"
    rev: str
    code: Path
    work: Path  # its index directory and outputs
    commit: str = ""
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def index_dir(self) -> Path:
        return self.work / "index"

    @property
    def live_index(self) -> Path:
        """Its index of the run and the empty appends' directory (``live``'s start)."""
        return self.work / "live-index"

    @property
    def live_run(self) -> Path:
        """The copy of `live_index` one ``live`` measurement updates."""
        return self.work / "live-run"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _is_commit(rev: str) -> bool:
    try:
        _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        return False
    return True


def _checkout(name: str, rev: str, tmp: Path) -> Side:
    """`rev` checked out under `tmp` (the working tree itself for ``.``)."""
    work = tmp / name
    work.mkdir()
    if rev == WORKING_TREE:
        dirty = " (with uncommitted changes)" if _git("status", "--porcelain", "-uno") else ""
        return Side(name, rev, REPO, work, _git("rev-parse", "HEAD") + dirty)
    code = tmp / f"code-{name}"
    _git("worktree", "add", "--detach", str(code), rev)
    return Side(name, rev, code, work, _git("rev-parse", f"{rev}^{{commit}}"))


def _remove(side: Side) -> None:
    if side.code != REPO:
        _git("worktree", "remove", "--force", str(side.code))


def _slices(text: str) -> tuple[int, ...]:
    """``--live-slices``: "60,240" or "60x20" (twenty appends of 60 requests)."""
    out: list[int] = []
    try:
        for part in text.split(","):
            n, x, times = part.partition("x")
            k = int(times) if x else 1
            if int(n) < 1 or k < 1:
                raise argparse.ArgumentTypeError(f"{text!r}: every append needs a request")
            out += [int(n)] * k
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not N,N,... nor NxK") from None
    return tuple(out)


def _prepare_live(
    sides: list[Side], traces: Path, tmp: Path, sizes: tuple[int, ...] = LIVE_SLICES
) -> Live:
    """The slices `_LIVE` appends (a synthetic run ten minutes after the run's end, cut
    by time, as `bench_report`'s Live stage with engine steps makes them, with new ids),
    and each side's index of the run with the appends' directory still empty, built
    once by its own code."""
    # a seed no earlier append used: bench_report's Live stages append seeds 7-11 to the
    # run they keep, and a slice with their ids would add no request (the same spans)
    seed = int(time.time())
    slices = _sliced(sizes, seed=seed, start_unix_s=_end_s(traces) + 600.0)
    live = Live(tmp / "live-slices.json", tmp / "live-appends")
    live.slices.write_text(json.dumps([part for _n, part in slices]))
    live.grow.mkdir()
    for side in sides:
        print(f"building {side.name}'s index for the live stage", flush=True)
        cmd = [sys.executable, "-c", _AT + _BUILD_LIVE, str(side.code), str(traces),
               str(live.grow), str(side.live_index)]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return live


def _command(side: Side, stage: str, traces: Path, out: Path, calls: int) -> list[str]:
    if stage == "console":
        pages = json.dumps({name: page for name, (page, _url, _charts) in PAGES.items()})
        args = [str(traces), str(side.index_dir), str(out), pages]
        return [sys.executable, "-c", _AT + _CONSOLE + _TOOK, str(side.code), *args]
    if stage == "compare":
        args = [str(traces), str(side.index_dir), str(out), str(calls)]
        return [sys.executable, "-c", _AT + _COMPARE + _TOOK, str(side.code), *args]
    fmt = stage if stage in ("json", "perfetto") else "table"
    args = ["report", "--traces", str(traces), "--index", "--index-dir", str(side.index_dir)]
    return [sys.executable, "-c", _AT + _REPORT, str(side.code), *args, "--format", fmt,
            "--out", str(out)]  # fmt: skip


def _once(
    side: Side, stage: str, traces: Path, calls: int, live: Live | None = None
) -> dict[str, Any]:
    """One measurement of `stage` on `side`; its output kept as ``<stage>.out``."""
    if stage == "cold":
        shutil.rmtree(side.index_dir, ignore_errors=True)
    out = side.work / f"{stage}.out"
    if stage == "live":  # from a fresh copy of the side's index, no appends yet
        assert live is not None
        shutil.rmtree(side.live_run, ignore_errors=True)
        shutil.copytree(side.live_index, side.live_run)
        shutil.rmtree(live.grow)
        live.grow.mkdir()
        cmd = _live_command(side, traces, live, out)
    else:
        cmd = _command(side, stage, traces, out, calls)
    got = measure(cmd)
    timed = ("compare", "live", "console")  # timed inside the process
    took = json.loads(Path(f"{out}.took").read_text()) if stage in timed else []
    if stage == "compare":  # the calls alone, not opening the index
        got = {"wall_s": round(statistics.fmean(took), 6), "process": got}
    elif stage == "console":  # the pages' script runs, not opening the index
        pages = {k: round(v, 4) for k, v in took["pages_s"].items()}
        got = {"wall_s": round(sum(pages.values()), 4), "pages_s": pages,
               "load_s": round(took["load_s"], 3), "warm_s": round(took["warm_s"], 3),
               "process": got}  # fmt: skip
    elif stage == "live":  # the updates after the appends, not opening the index
        requests = json.loads(out.read_text())["requests"]  # the run after the appends
        did = json.loads(Path(f"{out}.did").read_text())
        got = {"wall_s": round(sum(took[:-1]), 6), "updates_s": took[:-1],
               "updates": did[:-1], "pause_s": took[-1], "pause": did[-1],
               "requests": requests, "process": got}  # fmt: skip
    got["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    return got


def _live_command(side: Side, traces: Path, live: Live, out: Path) -> list[str]:
    """`_LIVE` on the side's copy of its index (`_once` makes it)."""
    return [sys.executable, "-c", _AT + _LIVE + _TOOK, str(side.code), str(traces),
            str(live.grow), str(side.live_run), str(live.slices), str(out)]  # fmt: skip


def _order(rounds: int) -> list[int]:
    """Indexes of the sides in A B B A order, `rounds` times."""
    return [0, 1, 1, 0] * rounds


def _stage(
    sides: list[Side], stage: str, traces: Path, rounds: int, calls: int, live: Live | None = None
) -> dict:
    for side in sides:
        side.runs[stage] = []
    for i in _order(rounds):
        side = sides[i]
        got = _once(side, stage, traces, calls, live)
        side.runs[stage].append(got)
        print(f"  {stage:8} {side.name} {got['wall_s']:8.3f} s", flush=True)
    a, b = (statistics.fmean(r["wall_s"] for r in s.runs[stage]) for s in sides)
    outputs = {r["sha256"] for s in sides for r in s.runs[stage]}
    result = {
        "a_wall_s": round(a, 3),
        "b_wall_s": round(b, 3),
        "ratio_b_over_a": round(b / a, 3) if a else None,
        "same_output": len(outputs) == 1,
    }
    if stage == "live":  # the update after the appends that brought nothing: a pause
        a_p, b_p = (statistics.fmean(r["pause_s"] for r in s.runs[stage]) for s in sides)
        result |= {"a_pause_s": round(a_p, 3), "b_pause_s": round(b_p, 3)}
        result["pause_ratio_b_over_a"] = round(b_p / a_p, 3) if a_p else None
    if stage == "console":  # each page, and the warm-up before any visit
        for key in ("warm_s", *(f"pages_s.{p}" for p in PAGES)):
            a_k, b_k = (statistics.fmean(_at(r, key) for r in s.runs[stage]) for s in sides)
            result.setdefault("parts", {})[key] = {
                "a_s": round(a_k, 3), "b_s": round(b_k, 3),
                "ratio_b_over_a": round(b_k / a_k, 3) if a_k else None}  # fmt: skip
    if stage not in ("compare", "live", "console"):  # those time calls inside the process
        a_cpu, b_cpu = (statistics.fmean(r["cpu_s"] for r in s.runs[stage]) for s in sides)
        result |= {"a_cpu_s": round(a_cpu, 2), "b_cpu_s": round(b_cpu, 2)}
        result["cpu_ratio_b_over_a"] = round(b_cpu / a_cpu, 3) if a_cpu else None
    return result


def _at(run: dict[str, Any], key: str) -> float:
    """``run[a][b]`` for ``key`` "a.b" (``run[key]`` for one without a dot)."""
    got: Any = run
    for part in key.split("."):
        got = got[part]
    return float(got)


def _table(result: dict[str, Any]) -> str:
    lines = [f"A = {result['a']['rev']} ({result['a']['commit']})",
             f"B = {result['b']['rev']} ({result['b']['commit']})",
             f"{'stage':8} {'A s':>9} {'B s':>9} {'B/A':>6}  output"]  # fmt: skip
    for stage, got in result["stages"].items():
        same = "same" if got["same_output"] else "DIFFERS"
        lines.append(
            f"{stage:8} {got['a_wall_s']:9.3f} {got['b_wall_s']:9.3f} "
            f"{got['ratio_b_over_a']:6.3f}  {same}"
        )
    if "pause_ratio_b_over_a" in result["stages"].get("live", {}):
        got = result["stages"]["live"]
        lines.append(
            f"{'pause':8} {got['a_pause_s']:9.3f} {got['b_pause_s']:9.3f} "
            f"{got['pause_ratio_b_over_a']:6.3f}  (live: the update after, with nothing new)"
        )
    for key, got in result["stages"].get("console", {}).get("parts", {}).items():
        name = key.removeprefix("pages_s.")
        lines.append(
            f"  {name:8} {got['a_s']:7.3f} {got['b_s']:9.3f} {got['ratio_b_over_a'] or 0:6.3f}"
        )
    for side in ("a", "b") if "live" in result["stages"] else ():
        lines.append(
            f"live {side.upper()}, each update's first run: "
            + _did(result[side]["runs"]["live"][0]["updates"])
        )
    return "\n".join(lines)


def _did(updates: list[dict[str, Any]]) -> str:
    """What a ``live`` run's updates did, in one line: why a side took longer."""
    return "; ".join(
        f"+{u['new_spans']} spans, {u['reanalysed']} analysed again, {u['behind']} behind, "
        f"steps {u['steps'] or '-'}, offsets "
        + " ".join(f"{k} {v:+.3f}" for k, v in u["offsets_ms"].items() if v)
        for u in updates
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Time two revisions of tracedpush's analysis side by side (A B B A).",
    )
    ap.add_argument("--a", default="HEAD", help="revision A (git rev, or . for the working tree)")
    ap.add_argument("--b", default=WORKING_TREE, help="revision B (default: the working tree)")
    ap.add_argument("--traces", type=Path, help="the run to analyse (default: a synthetic one)")
    ap.add_argument(
        "--requests", type=int, default=10_000, help="without --traces: synthetic requests"
    )
    ap.add_argument(
        "--stage",
        action="append",
        choices=STAGES,
        help="what to time (repeatable; default: warm, json and compare)",
    )
    ap.add_argument(
        "--live-slices",
        type=_slices,
        default=LIVE_SLICES,
        metavar="N,N,...",
        help="live: the requests of each append, or NxK for K appends of N (a console "
        "left open: 60x20 reaches the merge of the index's kept segments); default "
        + ",".join(map(str, LIVE_SLICES)),
    )
    ap.add_argument("--rounds", type=int, default=1, help="A B B A this many times")
    ap.add_argument("--calls", type=int, default=3, help="compare: calls per measurement")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON to write (%(default)s)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        ap.error("--rounds and --calls must be at least 1")
    for flag, rev in (("--a", args.a), ("--b", args.b)):  # before any checkout or build
        if rev != WORKING_TREE and not _is_commit(rev):
            ap.error(f"{flag} {rev}: not a commit of {REPO} (git rev-parse, git log)")
    stages = args.stage or ["warm", "json", "compare"]
    with tempfile.TemporaryDirectory(prefix="tracedpush-abba-") as tmp_s:
        tmp = Path(tmp_s)
        traces = args.traces
        if traces is None:
            traces = tmp / "traces"
            print(f"writing {args.requests} synthetic requests", flush=True)
            _write_traces(args.requests, traces)
        elif not traces.is_dir():
            ap.error(f"--traces {traces}: not a directory")
        sides: list[Side] = []
        try:
            for name, rev in (("A", args.a), ("B", args.b)):
                sides.append(_checkout(name, rev, tmp))
            calibration = [_calibration_s()]
            live = _prepare_live(sides, traces, tmp, args.live_slices) if "live" in stages else None
            if any(s in _WARM_INDEX for s in stages):
                for side in sides:  # the warm stages' index, built once per side
                    print(f"building {side.name}'s index", flush=True)
                    measure(_command(side, "warm", traces, side.work / "build.out", 1))
            result: dict[str, Any] = {"stages": {}}
            for stage in stages:
                got = _stage(sides, stage, traces, args.rounds, args.calls, live)
                result["stages"][stage] = got
            calibration.append(_calibration_s())
        finally:
            for side in sides:
                _remove(side)
    for side in sides:
        result[side.name.lower()] = {"rev": side.rev, "commit": side.commit, "runs": side.runs}
    result |= {
        "traces": str(args.traces) if args.traces else f"synthetic, {args.requests} requests",
        "rounds": args.rounds,
        "order": "".join("AB"[i] for i in _order(args.rounds)),
        # CPU s of a fixed Python loop before and after: how fast the machine ran
        "calibration_s": calibration,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(_table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(s["same_output"] for s in result["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
