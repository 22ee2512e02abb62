"""Console first render for 10,000 requests: the issue's "under 2 s" target.

Generates synthetic push/pull traces (tracedpush.testing.synthetic), then measures:

* load + analysis of the directory, once per server (cold; cached afterwards),
* each page's first render for a new session with the analysis cached (AppTest, the
  script run that builds every figure),
* a real browser (headless Chromium against `tracedpush console`'s server): how long the
  server takes from its start until its warm-up has loaded and analysed the run
  (`console.server`), the first visit after that, new sessions afterwards, and each
  page as the first visit of a new browser (Streamlit's JavaScript not cached;
  ``--repeats`` times, the pages in turn), each until the script has finished and every
  Plotly chart has drawn; for those, where the time went: Chromium's counters for the
  page's renderer (main thread busy, of which JavaScript) and the JavaScript fetched.

Prints a table and writes docs/benchmarks/console.md and console.json.

    python benchmarks/bench_console.py [--requests 10000] [--no-browser]
    python benchmarks/bench_console.py --traces DIR  # a run already there (e.g. the
        # 200,000 requests bench_report.py --keep DIR built; its analysis index is used)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_report import _calibration_s  # how fast the machine runs Python, now

from tracedpush.bench.argtypes import positive
from tracedpush.envs import INDEX_ROOT

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "console" / "app.py"
OUT = REPO / "docs" / "benchmarks"
PAGES = {  # page -> (AppTest page path, URL path, charts it draws)
    "overview": (None, "", 4),
    "requests": ("views/requests.py", "requests", 1),
    "timeline": ("views/timeline.py", "timeline", 1),
    "phases": ("views/phases.py", "phases", 1),
    "live": ("views/live.py", "live", 1),
    "export": ("views/export.py", "export", 0),
}


def _write_traces(n: int, directory: Path) -> float:
    from tracedpush.testing.synthetic import generate

    started = time.perf_counter()
    generate(n, seed=1, clock_offsets_ms={"decode-0": 5.0}, start_unix_s=time.time() - 3600).write(
        directory
    )
    return time.perf_counter() - started


def _load(directory: Path) -> dict[str, Any]:
    from tracedpush.console import data, derived
    from tracedpush.console.source import Source

    feed = data.Feed(Source("traces", str(directory)))
    started = time.perf_counter()
    snap = feed.snapshot()
    total = time.perf_counter() - started
    # what the server's warm-up derives (`derived.warm`), property by property
    parts: dict[str, float] = {}
    for name in (*derived.SHARED, "phase_frame"):
        t0 = time.perf_counter()
        getattr(snap, name)
        parts[name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    derived.phase_boxes(snap, next(iter(derived.PHASE_MEASURES)), snap.modes)
    parts["phase_boxes"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    derived.warm(snap)  # the rest: the first visits' figures and the Phases outliers
    parts["figures_and_outliers"] = time.perf_counter() - t0
    return {
        "load_and_analyse_s": total,
        "analyse_s": feed.analysis_seconds,
        "derived_frames_s": sum(parts.values()),
        "derived_s": parts,
        "requests": len(snap.run.requests),
        "spans": snap.stats.spans,
    }


def _apptest(directory: Path, repeats: int) -> dict[str, dict[str, float]]:
    """Per page: seconds of the first script run for a new session, cache warm."""
    from streamlit.testing.v1 import AppTest

    os.environ["TRACEDPUSH_TRACES"] = str(directory)
    started = time.perf_counter()
    AppTest.from_file(str(APP), default_timeout=600).run()  # loads and caches the feed
    cold = time.perf_counter() - started
    out: dict[str, dict[str, float]] = {"_cold_first_run": {"median_s": cold, "max_s": cold}}
    for name, (page, _, _) in PAGES.items():
        times = []
        for _ in range(repeats):
            at = AppTest.from_file(str(APP), default_timeout=600)
            if page is None:
                t = time.perf_counter()
                at.run()
            else:
                at.run()  # st.navigation needs one run before switching pages
                at.switch_page(page)
                t = time.perf_counter()
                at.run()
            times.append(time.perf_counter() - t)
            if at.exception:
                raise SystemExit(f"{name}: {at.exception[0].value}")
        out[name] = {"median_s": statistics.median(times), "max_s": max(times)}
    return out


_JS_FETCHED = """return performance.getEntriesByType('resource')
    .filter(e => e.name.split('?')[0].endsWith('.js'))
    .reduce((n, e) => n + e.transferSize, 0)"""  # 0 for a script from the browser's cache


def _metrics(driver) -> dict[str, float]:
    got = driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]
    return {m["name"]: m["value"] for m in got}


def _open(driver, url: str) -> None:
    """A browser's first request (its start is not a page's time), and the renderer's
    counters on: its main thread's busy time and JavaScript time, per visit."""
    driver.get(f"{url}/_stcore/health")
    driver.execute_cdp_cmd("Performance.enable", {})


def _visit(driver, url: str, charts: int) -> tuple[float, dict[str, float]]:
    """Seconds until rendered, and where the browser spent them: its renderer's main
    thread busy (`TaskDuration`), of which running JavaScript (`ScriptDuration`; its
    compiling is not counted apart: `V8CompileDuration` stays 0 without a trace), and the
    MB of JavaScript it fetched (none from its cache). The counters are the renderer
    process's: right for a new browser's one page (its health check before costs
    ~nothing, in whichever process), not for a page after another in the same browser,
    which Chromium may move to a new process (the counters restart): `_browser_time`
    shows them for new browsers only."""
    from tracedpush.testing import browser

    before = _metrics(driver)
    started = time.perf_counter()
    driver.get(url)
    browser.wait_rendered(driver, charts=charts, timeout=600)
    took = time.perf_counter() - started
    after = _metrics(driver)
    spent = {
        "main_thread_s": after["TaskDuration"] - before["TaskDuration"],
        "javascript_s": after["ScriptDuration"] - before["ScriptDuration"],
        "js_fetched_mb": driver.execute_script(_JS_FETCHED) / 1e6,
    }
    return took, spent


def _summary(visits: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    times = [t for t, _ in visits]
    out = {"median_s": statistics.median(times), "max_s": max(times)}
    for key in visits[0][1]:
        out[key] = statistics.median(spent[key] for _, spent in visits)
    return out


def _browser(directory: Path, repeats: int) -> dict[str, dict[str, float]]:
    """Chromium against `streamlit run`: every page load is a new Streamlit session."""
    from tracedpush.testing import browser

    missing = browser.available()
    if missing:
        return {"skipped": {"reason": f"needs {missing}"}}  # type: ignore[dict-item]
    # the server's log, gone with the run; shown if the run fails
    with tempfile.TemporaryDirectory(prefix="tracedpush-bench-console-") as tmp:
        log = Path(tmp) / "server.log"
        try:
            return _browse(directory, repeats, log)
        except BaseException:
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-40:]
                print("--- the console server's log ---", *tail, sep="\n", file=sys.stderr)
            raise


def _browse(directory: Path, repeats: int, log: Path) -> dict[str, dict[str, float]]:
    from tracedpush.testing import browser
    from tracedpush.testing.console_server import ConsoleServer

    out: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    with ConsoleServer(["--traces", str(directory)], timeout=120, log_path=log) as server:
        print(server.wait_ready(timeout=1800), flush=True)  # `console.server`'s warm-up
        ready = time.perf_counter() - started
        out["_ready"] = {"median_s": ready, "max_s": ready}
        with browser.chromium() as driver:  # the first visitor, empty browser cache
            _open(driver, server.url)
            out["_first_visit"] = _summary([_visit(driver, server.url, 5)])
        with browser.chromium() as driver:  # a returning browser: JavaScript cached
            _open(driver, server.url)
            _visit(driver, server.url, 5)  # its first visit caches it (not counted)
            for name, (_, url_path, charts) in PAGES.items():
                url = f"{server.url}/{url_path}"
                out[name] = _summary([_visit(driver, url, charts) for _ in range(repeats)])
        fresh: dict[str, list[tuple[float, dict[str, float]]]] = {}
        for _ in range(repeats):  # each page in a new browser, `repeats` times, in turn
            for name, (_, url_path, charts) in PAGES.items():
                with browser.chromium() as driver:
                    _open(driver, server.url)
                    url = f"{server.url}/{url_path}"
                    wait = charts if url_path else 5  # as the first visit's overview
                    fresh.setdefault(name, []).append(_visit(driver, url, wait))
        for name, visits in fresh.items():
            out[f"_fresh_browser_{name}"] = _summary(visits)
    return out


def _how(result: dict) -> str:
    source = result.get("source", "synthetic")
    return f"--requests {result['requests']}" if source == "synthetic" else f"--traces {source}"


def _markdown(result: dict) -> str:
    lines = [
        "# Console first render",
        "",
        f"`python benchmarks/bench_console.py {_how(result)}` on "
        f"{result['machine']} ({result['cpus']} CPUs), {result['date']}; 1-minute load "
        f"average {result['loadavg_start']:.1f} at the start, {result['loadavg_end']:.1f} at "
        "the end (other work shared the machine)"
        + (
            f"; a fixed Python loop took {' / '.join(map(str, result['calibration_cpu_s']))} s "
            "of CPU before / after (how fast the machine ran: `bench_report.py`'s calibration)."
            if "calibration_cpu_s" in result
            else "."
        ),
        (
            "Synthetic push/pull traces (`tracedpush.testing.synthetic`): "
            if result.get("source", "synthetic") == "synthetic"
            else f"The run in `{result['source']}` (analysis index already built): "
        )
        + f"{result['load']['requests']:,} requests, {result['load']['spans']:,} spans.",
        "",
        "| what | median s | max s |",
        "|---|---:|---:|",
        f"| load + analysis (once per server, then cached) | "
        f"{result['load']['load_and_analyse_s']:.2f} | |",
        f"| of which analysis | {result['load']['analyse_s']:.2f} | |",
        f"| what the warm-up derives (`derived.warm`) | "
        f"{result['load']['derived_frames_s']:.2f} | |",
    ]
    for name, took in result["load"].get("derived_s", {}).items():
        lines.append(f"| of which `{name}` | {took:.2f} | |")
    for name, row in result["apptest"].items():
        label = "first script run, cold (includes load)" if name.startswith("_") else name
        lines.append(f"| AppTest {label} | {row['median_s']:.2f} | {row['max_s']:.2f} |")
    for name, row in result.get("browser", {}).items():
        if "median_s" not in row:
            lines.append(f"| browser: {row.get('reason')} | | |")
            continue
        label = {
            "_ready": "server start until ready (load, analysis, warm-up; no visitor)",
            "_first_visit": "overview, the first visit once ready (nothing cached in it)",
            "_cold_overview": "first visit after server start (includes load + analysis)",
        }.get(name, f"{name}, new session, analysis cached")
        if name.startswith("_fresh_browser_"):
            page = name.removeprefix("_fresh_browser_")
            label = f"{page}, new browser (nothing cached), analysis cached"
        lines.append(f"| Chromium {label} | {row['median_s']:.2f} | {row['max_s']:.2f} |")
    lines += _browser_time(result.get("browser", {}))
    lines += [
        "",
        "AppTest rows: one script run for a new session with the analysis cached (every",
        "figure built and serialised). Chromium rows: from navigation until the script has",
        "finished and every Plotly chart has drawn its SVG; each page load is a new Streamlit",
        "session (a returning browser has Streamlit's JavaScript cached). Target (issue 5):",
        "under 2 s with the analysis cached. The server loads, analyses and derives what",
        "the pages read as it starts (`console.server`), before any visitor: the first",
        "visit after that waits only for its own page; one that arrives earlier waits for",
        "the rest of the warm-up.",
        "",
    ]
    return "\n".join(lines)


def _browser_time(rows: dict[str, dict[str, float]]) -> list[str]:
    """Where a new browser's first render went (medians), beside a new session's render:
    the renderer's main thread busy, of which running JavaScript, and the
    JavaScript fetched (a new browser's cache is empty)."""
    lines = [
        "",
        "Where a new browser's first render goes (medians; Chromium's own counters for the",
        "page's renderer; a new session, JavaScript cached, for comparison):",
        "",
        "| page | new session s | new browser s | main thread busy s | of which JavaScript s "
        "| JavaScript fetched MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for page in PAGES:
        row, session = rows.get(f"_fresh_browser_{page}", {}), rows.get(page, {})
        if "main_thread_s" in row and "median_s" in session:
            lines.append(
                f"| {page} | {session['median_s']:.2f} | {row['median_s']:.2f} | "
                f"{row['main_thread_s']:.2f} | {row['javascript_s']:.2f} | "
                f"{row['js_fetched_mb']:.1f} |"
            )
    return lines if len(lines) > 6 else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests",
        type=positive(int),
        default=10_000,
        help="synthetic requests to generate (%(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=positive(int),
        default=3,
        help="new-browser visits of every page, their median and maximum (%(default)s)",
    )
    parser.add_argument(
        "--no-browser", action="store_true", help="AppTest only: no headless Chromium"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="where the figures go (%(default)s)")
    parser.add_argument("--traces", type=Path, help="measure this traces directory instead")
    args = parser.parse_args(argv)
    # the run's index is beside it, where the server finds it (its first load builds it
    # there): TRACEDPUSH_INDEX_ROOT from the shell would move it
    os.environ.pop(INDEX_ROOT, None)
    sys.path.insert(0, str(REPO))

    with tempfile.TemporaryDirectory(prefix="tracedpush-bench-console-") as tmp:
        directory = args.traces or Path(tmp)
        gen_s = 0.0
        if args.traces is None:
            print(f"generating {args.requests:,} requests ...", flush=True)
            gen_s = _write_traces(args.requests, directory)
        result = {
            "requests": args.requests,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"),
            "loadavg_start": os.getloadavg()[0],
            "calibration_cpu_s": [_calibration_s()],
            "generate_s": gen_s,
            "load": _load(directory),
        }
        result["requests"] = result["load"]["requests"]
        result["source"] = "synthetic" if args.traces is None else str(args.traces)
        print(f"load + analysis: {result['load']['load_and_analyse_s']:.2f} s", flush=True)
        result["apptest"] = _apptest(directory, args.repeats)
        if not args.no_browser:
            result["browser"] = _browser(directory, args.repeats)
    result["loadavg_end"] = os.getloadavg()[0]
    result["calibration_cpu_s"].append(_calibration_s())
    text = _markdown(result)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "console.md").write_text(text)
    (args.out / "console.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out / 'console.md'} and console.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
