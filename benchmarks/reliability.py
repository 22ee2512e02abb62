"""Reliability figures: run the fault tests and print each fault, what should happen, what did.

Runs the tests behind docs/reliability.md's table through pytest, with
TRACEDPUSH_FIGURES pointing at a JSON-lines file where each test records what it
measured (the ``figures`` fixture, tracedpush/testing/figures.py):

    tests/e2e/test_faults.py                engine kills (some `soak`), hung collector
    tests/e2e/test_client_faults.py         clients that hang up early
    tests/unit/test_proxy_slow_readers.py   200 slow readers (proxy-only)
    tests/e2e/test_fuzz_engines.py          fuzzed requests through the proxy to real engines

then prints every fault with its expected behaviour and the measured figures, push and
pull side by side, and writes docs/benchmarks/reliability.json (figures, date, machine).
`--write-doc` also replaces the table in docs/reliability.md between the markers
<!-- reliability-table:start --> and <!-- reliability-table:end -->.

    python benchmarks/reliability.py [--quick] [--write-doc] [-- PYTEST_ARGS...]
    python benchmarks/reliability.py --from-figures FIGURES.jsonl [--write-doc]

The e2e tests start real vLLM engines several times (under the engines lock, so never
beside another engine run); `--quick` leaves out the `soak` tests (the pull-mode engine
kills and the 2P1D prefill kill), about eight minutes. Progress: one line per test
result, and one a minute.

If a test fails, or one the table needs recorded nothing, the script says which, prints
what it got, writes neither the doc nor docs/benchmarks (the run's JSON stays in the
work directory) and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracedpush.launcher.servers import installed_vllm
from tracedpush.testing.figures import ENV, read_figures

ROOT = Path(__file__).resolve().parents[1]
TESTS = (
    "tests/e2e/test_faults.py",
    "tests/e2e/test_client_faults.py",
    "tests/unit/test_proxy_slow_readers.py",
    "tests/e2e/test_fuzz_engines.py",
)
DOC = ROOT / "docs" / "reliability.md"
OUT = ROOT / "docs" / "benchmarks" / "reliability.json"
START = "<!-- reliability-table:start -->"
END = "<!-- reliability-table:end -->"
MODES = ("push", "pull")

Record = dict[str, Any]


# ------------------------------------------------------------------ figures -> text


def num(figures: dict[str, Any], key: str, spec: str = ".1f") -> str:
    """One figure formatted with `spec`, or "?" when the test did not get that far."""
    value = figures.get(key)
    if value is None:
        return "?"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def _last(records: list[Record]) -> dict[str, Any]:
    return records[-1]["figures"]


def describe_decode_kill(records: list[Record]) -> str:
    f = _last(records)
    return (
        f"{num(f, 'requests_failed', 'd')}/{num(f, 'requests_in_flight', 'd')} failed "
        f"({num(f, 'failed_with_502', 'd')} with a 502, {num(f, 'failed_in_stream', 'd')} by an "
        f"SSE error; {num(f, 'failed_naming_decode', 'd')} naming the decode leg), every client "
        f"answered {num(f, 'answered_within_s')} s after the kill at most; "
        f"{num(f, 'requests_lost', 'd')} lost; P healthy at "
        f"{num(f, 'prefill_probes_healthy', 'd')}/{num(f, 'prefill_probes', 'd')} probes; "
        f"P's KV freed {num(f, 'prefill_kv_freed_s')} s after the kill; D back "
        f"{num(f, 'decode_back_s', '.0f')} s after it; {num(f, 'requests_after_ok', 'd')}/"
        f"{num(f, 'requests_after', 'd')} succeeded after; {num(f, 'traced_errors', 'd')} "
        f"failed requests' traces with their error"
    )


def describe_prefill_kill(records: list[Record]) -> str:
    f = _last(records)
    return (
        f"{num(f, 'requests_failed', 'd')}/{num(f, 'requests_cut', 'd')} failed "
        f"({num(f, 'failed_naming_prefill', 'd')} naming the prefill leg, "
        f"{num(f, 'failed_decode_gave_up', 'd')} D's error before any token), answered "
        f"{num(f, 'failed_answered_within_s')} s after the kill at most; "
        f"{num(f, 'requests_lost', 'd')} lost; D's KV usage "
        f"{num(f, 'decode_kv_usage_at_kill', '.3f')} at the kill, 0 "
        f"{num(f, 'decode_kv_freed_after_last_answer_s')} s after the last answer; "
        f"{num(f, 'requests_after_ok', 'd')}/{num(f, 'requests_after', 'd')} succeeded after; "
        f"{num(f, 'traced_errors', 'd')} failed requests' traces with their error; the "
        f"killed P back {num(f, 'prefill_back_s', '.0f')} s after the kill, then "
        f"{num(f, 'requests_after_restart_failed', 'd')} of "
        f"{num(f, 'requests_after_restart', 'd')} requests failed "
        f"({num(f, 'restarted_prefill_served', '.0f')} served by the restarted P)"
    )


def describe_hung_collector(records: list[Record]) -> str:
    f = _last(records)
    return (
        f"D's step p50 {num(f, 'decode_step_p50_healthy_ms', '.2f')} ms healthy, "
        f"{num(f, 'decode_step_p50_hang_ms', '.2f')} ms during "
        f"{num(f, 'hang_times', 'd')} hangs, {num(f, 'hang_s', '.0f')} s in all "
        f"(x{num(f, 'step_p50_ratio', '.2f')}); "
        f"{num(f, 'spans_dropped_min', 'd')}-{num(f, 'spans_dropped_max', 'd')} spans dropped "
        f"and counted per engine process ({num(f, 'engine_processes_counting', 'd')} "
        f"processes); {num(f, 'spans_after_recovery', 'd')} spans arrived once it answered "
        f"again; {num(f, 'requests_whole', 'd')}/{num(f, 'requests', 'd')} requests whole"
    )


def describe_store_full(records: list[Record]) -> str:
    f = _last(records)
    if "store_full" in f:  # the phase did not run (no tmpfs): the test says why
        return str(f["store_full"])
    return (
        f"full {num(f, 'store_full_times', 'd')} times, {num(f, 'store_full_s', '.0f')} s in "
        f"all under load: client token gap p50 {num(f, 'token_gap_p50_room_ms', '.2f')} ms "
        f"with room, {num(f, 'token_gap_p50_full_ms', '.2f')} ms full "
        f"(x{num(f, 'token_gap_full_ratio', '.2f')}); "
        f"at least {num(f, 'store_full_dropped_min', '.0f')} spans dropped per engine on its "
        f"/metrics (reason store_full); at most {num(f, 'store_full_log_lines_max', 'd')} "
        f"warning lines per log; writing resumed by itself, "
        f"{num(f, 'store_full_counted_in_store', 'd')} drops recorded in the store; no torn "
        f"line; {num(f, 'requests_whole', 'd')}/{num(f, 'requests', 'd')} requests whole"
    )


def describe_fuzz(records: list[Record]) -> str:
    def total(key: str) -> int:
        return sum(int(r["figures"].get(key, 0)) for r in records)

    statuses = {
        k.removeprefix("status_"): total(k)
        for k in sorted({k for r in records for k in r["figures"] if k.startswith("status_")})
    }
    idle = max(
        float(r["figures"].get(k, 0))
        for r in records
        for k in ("prefill_idle_after_s", "decode_idle_after_s")
    )
    return (
        f"{total('cases')} cases in {len(records)} runs; statuses "
        + ", ".join(f"{k}: {v}" for k, v in statuses.items())
        + f"; 0 engine crashes or restarts; {total('upstream_5xx')} upstream 5xx; "
        f"{total('engine_4xx')} engine 4xx relayed, each naming its field; engines idle "
        f"{idle:.1f} s after the last case at most"
    )


WHEN_ORDER = ("before the first token", "mid-stream")


def describe_client_leaves(records: list[Record]) -> str:
    by_when = {r["params"].get("when"): r["figures"] for r in records}
    parts = []
    for when in sorted(by_when, key=lambda w: WHEN_ORDER.index(w) if w in WHEN_ORDER else 9):
        f = by_when[when]
        parts.append(
            f"{when}: P freed after {num(f, 'prefill_kv_freed_s', '.2f')} s, D after "
            f"{num(f, 'decode_kv_freed_s', '.2f')} s; next request "
            f"{num(f, 'after_request_tokens', 'd')}/{num(f, 'after_request_expected', 'd')} tokens"
        )
    return "; ".join(parts)


def describe_slow_readers(records: list[Record]) -> str:
    f = _last(records)
    return (
        f"{num(f, 'streaming', 'd')}/{num(f, 'slow_readers', 'd')} streaming and "
        f"{num(f, 'in_flight', '.0f')} in flight 1.5 s after connecting; proxy RSS "
        f"+{num(f, 'proxy_rss_growth_mb')} MB, {num(f, 'proxy_cpu_cores', '.2f')} of a core; "
        f"fast client TTFT p50 {num(f, 'fast_ttft_p50_alone_ms')} ms alone, "
        f"{num(f, 'fast_ttft_p50_beside_ms')} ms beside them "
        f"(x{num(f, 'fast_ttft_ratio')}); all released {num(f, 'released_s', '.2f')} s "
        f"after they left"
    )


# --------------------------------------------------------------------- the faults


@dataclass(frozen=True)
class Fault:
    """One row of the table: the fault, what should happen, and where it is measured."""

    fault: str
    expected: str
    test: str  # file
    function: str | None = None  # the test function whose records measure it
    describe: Callable[[list[Record]], str] | None = None  # one mode's records -> text
    modes: tuple[str, ...] = MODES  # modes the test runs in
    soak: tuple[str, ...] = ()  # modes marked `soak` (left out by --quick)
    measured: str = ""  # for rows not measured by this script
    also: tuple[str, ...] = ()  # other test functions whose records count too (soak variants)


FAULTS: tuple[Fault, ...] = (
    Fault(
        "D's whole process tree SIGKILLed with 8 streamed requests in flight",
        "every client answered within 30 s with 502 or an SSE error event naming the decode "
        "leg; P healthy throughout; P's KV freed within vLLM's KV lease (30 s) + 30 s (pull "
        "waits out the lease); `up` restarts D (`--on-exit restart`); the next 16 requests "
        "succeed; each failed request's trace has its error",
        "tests/e2e/test_faults.py",
        "test_killing_decode_under_load_leaves_prefill_serving",
        describe_decode_kill,
        soak=("pull",),
    ),
    Fault(
        "one P of a 2P1D SIGKILLed under a closed loop of 8 streamed clients (~1,800-token "
        "prompts); `up` restarts it on its port under its engine id",
        "every failed client answered within 30 s: 502 naming the prefill leg, or (P "
        "answered, then died before its WRITE) D's error before any token; D frees every "
        "block (push: the producer watch, docs/connector.md); the other P serves the next "
        "16 requests; each failed request's trace has its error; once the killed P is "
        "back, it serves again (D's producer renewal): push loses no request, pull at "
        "most the one whose READ found the old P gone",
        "tests/e2e/test_faults.py",
        "test_killing_a_prefill_mid_transfer_leaves_the_other_serving",
        describe_prefill_kill,
        soak=("push", "pull"),
    ),
    Fault(
        "the OTLP collector of a 1P1D push (engines and proxy export to it) accepts "
        "connections and never answers for 15 s, then answers again; twice, 10 s apart, "
        "under a closed loop of 4 streamed clients",
        "D's decoding steps keep their duration (p50 over both hangs within x1.5 of the "
        "healthy windows between); drops counted in the "
        "engines' `engine.export` records; export resumes without a restart; no request lost",
        "tests/e2e/test_faults.py",
        "test_a_hanging_collector_never_slows_the_engines",
        describe_hung_collector,
        modes=("push",),
    ),
    Fault(
        "the trace store (the JSON-lines directory, on its own 256 MB tmpfs) is full for "
        "5 s, then has room for 5 s, three times, on the same 1P1D push under the same "
        "load (before the collector hangs)",
        "engines unaffected (client gap between tokens, p50, full within x1.5 of with "
        "room); drops counted on the engines' /metrics and in the store, with one warning "
        "line per exporter, not one per span; "
        "writing resumes when space returns, and no line is torn",
        "tests/e2e/test_faults.py",
        "test_a_hanging_collector_never_slows_the_engines",
        describe_store_full,
        modes=("push",),
    ),
    Fault(
        "a streamed client hangs up before its first token, or after 5 tokens (4 clients, "
        "~1,000-token prompts, shared 1P1D)",
        "P and D free every block; the next request is whole. Push: vLLM 0.32 frees D's "
        "registered blocks only when P's WRITE lands, so the proxy lets P's leg finish (D "
        "held them for good before that fix)",
        "tests/e2e/test_client_faults.py",
        "test_a_client_that_leaves_costs_the_engines_nothing",
        describe_client_leaves,
    ),
    Fault(
        "200 concurrent streamed clients that read slowly (512 bytes every 200 ms on a "
        "4 KiB receive buffer) while D streams 200 tokens each at 50 tokens/s; one fast "
        "client beside them (proxy-only: the engines are stand-ins in their own processes, "
        "the proxy is the real `tracedpush proxy`)",
        "all 200 served at once, none queued or lost; the proxy's memory bounded (< 64 MB) "
        "and CPU < 0.9 of a core; a fast client not queued behind them (the proxy's one "
        "event loop is busy relaying, a slow reader itself holds nothing up); every stream "
        "released at both ends when they leave",
        "tests/unit/test_proxy_slow_readers.py",
        "test_200_slow_readers_cost_the_proxy_little_and_the_other_clients_nothing",
        describe_slow_readers,
    ),
    Fault(
        "fuzzed requests (Hypothesis over the proxy's request schema: wrong types, unknown "
        "fields, bad token ids, n>1, oversized bodies) through the proxy to the real "
        "engines of the shared 1P1D; 100 cases per mode in `make test`, 1,500 in `make soak`",
        "0 engine crashes or restarts; no 5xx but a documented upstream failure; every "
        "4xx names the field; a 200 only for a valid body, with a whole answer; the "
        "engines idle again afterwards",
        "tests/e2e/test_fuzz_engines.py",
        "test_real_engines_survive_fuzzed_requests",
        describe_fuzz,
        also=("test_real_engines_survive_fuzzed_requests_soak",),
        soak=(),
    ),
    Fault(
        "an engine or the proxy exits while `up` runs",
        "`restart`: restarted with backoff, others untouched, old session cleared first; "
        "`stop`: everything stops; `keep`: reported once, others keep running",
        "tests/unit/test_launcher_processes.py",
        measured="unit tests on stand-in servers (not run by this script)",
    ),
    Fault(
        "an idle keep-alive connection closed by the engine as the proxy reuses it, or "
        "reset when the leg on it arrives at an API server stalled past its 5 s keep-alive",
        "no lost request: the proxy drops idle engine connections after 2 s, before vLLM's "
        "5 s; a leg whose kept-alive connection the engine closed unanswered is sent again "
        "once, on a new connection, and the wait is that engine's `api server`",
        "tests/unit/test_proxy_upstream.py",
        measured='was 1 lost request (502 "Server disconnected") in one full-suite run; '
        "with D's API server stopped 8 s (tests/e2e/test_late_registration.py), 2 of 4 D "
        "legs were reset and sent again, none lost (2026-12-06; not run by this script)",
    ),
)


def records_of(fault: Fault, mode: str, records: list[Record]) -> list[Record]:
    """The records of `fault`'s test in `mode` (a test run in one mode has no mode param)."""
    default = fault.modes[0] if len(fault.modes) == 1 else None
    return [
        r
        for r in records
        if r.get("test") in (fault.function, *fault.also)
        and r.get("params", {}).get("mode", default) == mode
    ]


def cell(fault: Fault, mode: str, records: list[Record], quick: bool) -> str:
    """What was measured for `fault` in `mode`, marked FAILED if a test did not pass."""
    if fault.function is None:
        return fault.measured if mode == MODES[0] else "(not mode-specific)"
    if mode not in fault.modes:
        return f"not run ({'/'.join(fault.modes)} only)"
    mine = records_of(fault, mode, records)
    if not mine:
        return (
            "not run (`soak`, left out by --quick)" if quick and mode in fault.soak else "not run"
        )
    assert fault.describe is not None
    text = fault.describe(mine)
    bad = [r for r in mine if r.get("outcome") != "passed"]
    if bad:
        text = f"FAILED ({', '.join(sorted({r.get('outcome', '?') for r in bad}))}): {text}"
    return text


def missing(records: list[Record], quick: bool = False) -> list[str]:
    """The tests (function[mode]) the table needs that recorded nothing."""
    return [
        f"{f.function}[{mode}]"
        for f in FAULTS
        if f.function
        for mode in f.modes
        if not (quick and mode in f.soak) and not records_of(f, mode, records)
    ]


def table(records: list[Record], quick: bool = False) -> list[dict[str, str]]:
    """The table's rows: fault, expected, push, pull, test."""
    return [
        {
            "fault": f.fault,
            "expected": f.expected,
            "push": cell(f, "push", records, quick),
            "pull": cell(f, "pull", records, quick),
            "test": f.test,
        }
        for f in FAULTS
    ]


def _md(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def markdown_table(rows: list[dict[str, str]]) -> str:
    """The rows as a GitHub markdown table."""
    lines = [
        "| fault | expected | measured: push | measured: pull | test |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        cells = (row["fault"], row["expected"], row["push"], row["pull"], row["test"])
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    return "\n".join(lines)


def doc_block(rows: list[dict[str, str]], report: dict[str, Any]) -> str:
    """What goes between the doc's markers: a note, the table, and where it came from."""
    m = report["machine"]
    counts = outcome_counts(report["tests"])
    tally = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no tests"
    return (
        "<!-- generated by `python benchmarks/reliability.py --write-doc`: edit the script, "
        "not this table -->\n\n"
        + markdown_table(rows)
        + f"\n\nFigures from the run of {report['when'][:10]} ({tally}; {m['machine']}, "
        f"{m['cpus']} CPUs, vLLM {m['vllm']}"
        + (
            f", 1-minute load {m['loadavg_1m']} at the end); "
            if m.get("loadavg_1m") is not None
            else "; re-rendered from the run's figures, its load not recorded); "
        )
        + "every figure: [benchmarks/reliability.json](benchmarks/reliability.json)."
    )


def replace_between_markers(text: str, block: str, start: str = START, end: str = END) -> str:
    """`text` with everything between the two marker lines replaced by `block`."""
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one {start} and one {end}")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    if end in head:
        raise ValueError(f"{end} comes before {start}")
    return f"{head}{start}\n{block.strip()}\n{end}{tail}"


def outcome_counts(records: list[Record]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.get("outcome", "?")] = counts.get(r.get("outcome", "?"), 0) + 1
    return counts


def print_table(rows: list[dict[str, str]], width: int = 100) -> None:
    """The rows for a terminal: one block per fault."""
    for i, row in enumerate(rows, 1):
        print(textwrap.fill(row["fault"], width, initial_indent=f"{i}. ", subsequent_indent="   "))
        for key in ("expected", "push", "pull", "test"):
            label = f"   {key + ':':10}"
            print(textwrap.fill(row[key], width, initial_indent=label, subsequent_indent=" " * 13))
        print()


# ------------------------------------------------------------------------ running


def machine(ran: bool = True) -> dict[str, Any]:
    """This machine; the load average only if the tests just ran here (`ran`)."""
    found = installed_vllm()
    vllm = found[1] if found is not None else "not installed"
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "mem_gib": mem_gib,
        "vllm": vllm,
        "loadavg_1m": round(os.getloadavg()[0], 2) if ran else None,
    }


PROGRESS = re.compile(
    r"::\S.* (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"  # one test's result (-v)
    r"|^(FAILED|ERROR) "  # the short summary (-rfE)
    r"|waiting for"  # the engines lock is held by another run
    r"|^=+ .*(passed|failed|error)"  # the last line
)


def pytest_command(quick: bool, extra: Sequence[str]) -> list[str]:
    """pytest on TESTS; `-m` overrides pyproject's addopts `-m 'not soak'`."""
    marks = "not soak" if quick else "soak or not soak"
    pytest = [sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider"]
    return [*pytest, "-m", marks, *TESTS, *extra]


def run_tests(figures: Path, log: Path, quick: bool, extra: Sequence[str]) -> int:
    """Run the tests, echoing progress lines; the whole output goes to `log`."""
    cmd = pytest_command(quick, extra)
    print(f"running: python {shlex.join(cmd[1:])}", flush=True)
    print(f"  figures -> {figures}; pytest output -> {log}", flush=True)
    t0 = time.monotonic()
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(60):
            n = len(read_figures(figures))
            minutes = (time.monotonic() - t0) / 60
            print(f"[{minutes:4.1f} min] still running, {n} tests recorded", flush=True)

    threading.Thread(target=heartbeat, daemon=True).start()
    env = {**os.environ, ENV: str(figures)}
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if PROGRESS.search(line):
                print(f"[{(time.monotonic() - t0) / 60:4.1f} min] {line.rstrip()}", flush=True)
        rc = proc.wait()
    done.set()
    return rc


def build_report(records: list[Record], quick: bool, exit_code: int | None) -> dict[str, Any]:
    """The JSON written to docs/benchmarks: when, machine, every record, the table's rows."""
    rows = table(records, quick)
    return {
        # the last test's end (or now, if none recorded)
        "when": max((r.get("when", "") for r in records), default="")
        or time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine(ran=exit_code is not None),
        "quick": quick,
        "pytest_exit_code": exit_code,
        "passed": all(r.get("outcome") == "passed" for r in records) and exit_code in (0, None),
        "missing": missing(records, quick),
        "tests": records,
        "faults": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Arguments after `--` go to pytest (e.g. `-- -k slow_readers`).",
    )
    parser.add_argument(
        "--quick", action="store_true", help="leave out the `soak` tests (pull-mode engine kills)"
    )
    parser.add_argument(
        "--write-doc",
        action="store_true",
        help=f"replace the table in docs/reliability.md between {START} and {END}",
    )
    parser.add_argument(
        "--from-figures",
        type=Path,
        metavar="JSONL",
        help="run nothing: build the table from a figures file an earlier run kept",
    )
    parser.add_argument(
        "--figures",
        type=Path,
        metavar="JSONL",
        help="where the tests record their figures (default: in a temporary work directory)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON to write (%(default)s)")
    parser.add_argument("--doc", type=Path, default=DOC, help="the doc --write-doc edits")
    parser.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write_doc and args.quick:
        parser.error("--write-doc needs the soak runs: run without --quick")

    exit_code: int | None = None
    if args.from_figures:
        figures, work = args.from_figures, args.from_figures.parent
        print(f"reading {figures} (running nothing)")
    else:
        work = Path(tempfile.mkdtemp(prefix="tp-reliability-"))
        figures = (args.figures or work / "figures.jsonl").absolute()
        figures.unlink(missing_ok=True)
        exit_code = run_tests(figures, work / "pytest.log", args.quick, args.pytest_args)
    records = read_figures(figures)
    report = build_report(records, args.quick, exit_code)

    print()
    print_table(report["faults"])
    counts = outcome_counts(records)
    print(f"{len(records)} tests recorded: " + ", ".join(f"{n} {o}" for o, n in counts.items()))
    if report["missing"]:
        print("no figures from: " + ", ".join(report["missing"]))
    if not report["passed"] or report["missing"]:
        for r in records:
            if r.get("outcome") != "passed":
                print(f"  {r.get('outcome', '?').upper()}: {r.get('nodeid')}")
        if exit_code not in (0, None):
            print(f"pytest exited with {exit_code}; its output: {work / 'pytest.log'}")
        kept = work / "reliability.json"
        kept.write_text(json.dumps(report, indent=2) + "\n")
        why = "not all tests passed" if not report["passed"] else "figures missing"
        print(f"{why}: wrote {kept}, not {args.out} nor the doc")
        return 1
    if not args.from_figures:
        print(f"figures kept in {figures} (re-render with --from-figures)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    if args.write_doc:
        text = args.doc.read_text()
        args.doc.write_text(replace_between_markers(text, doc_block(report["faults"], report)))
        print(f"wrote the table in {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
