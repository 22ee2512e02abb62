"""`tracedpush console`: serve the Streamlit console on a traces directory or Jaeger, and
on a benchmark sweep's results (``--bench``: the Sweep page).

The app lives in ``console/`` at the top of the repository, installed as the
``tracedpush.console`` package (pyproject.toml maps it), so this command finds ``app.py``
beside itself wherever tracedpush is installed. It imports neither Streamlit nor the
app: it only builds a ``streamlit run`` command line (run by ``console/server.py``, which
loads the source while the server starts), and the app parses the arguments after ``--``
itself (``console/source.py``), so ``streamlit run console/app.py -- ...`` behaves the
same, only without that warm-up.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tracedpush import tuning

DEFAULT_PORT = 8501


def app_path() -> Path:
    """The console's entry script, from a source checkout or an installed wheel."""
    return Path(__file__).resolve().parent / "app.py"


EPILOG = """The server loads its source as it starts (the first time on a big run, it builds
the analysis index beside the traces, as `tracedpush report` does), analyses it, and prints
`tracedpush console: ready: N requests ...` once a visit only has to draw its page, or
`tracedpush console: not ready: ...` and why. See docs/console.md."""

EPILOG += "\n\n" + tuning.HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--traces",
        metavar="DIR",
        action="append",
        help="directory (or one .jsonl file) of tracedpush traces; repeat to read several "
        "as one store (e.g. the engines' traces_dir and the proxy's --traces)",
    )
    source.add_argument(
        "--jaeger", metavar="URL", help="Jaeger query base URL, e.g. http://localhost:16686"
    )
    parser.add_argument(
        "--bench",
        metavar="PATH",
        help="benchmark results for the Sweep page: a `tracedpush bench sweep` directory or "
        "one `vllm bench serve --save-detailed` result file; without --traces/--jaeger, "
        "the traces are PATH/traces",
    )
    parser.add_argument(
        "--index-dir",
        metavar="DIR",
        help="trace files: keep their analysis index here (default: .tracedpush-index/ in "
        "the first traces directory, or a directory per set of traces under "
        "$TRACEDPUSH_INDEX_ROOT when that is set). Use it when that directory is read-only, "
        "or to open the index of `tracedpush report --index-dir DIR`",
    )
    parser.add_argument(
        "--service",
        default=None,
        help="Jaeger service to search (default: the proxy services Jaeger knows)",
    )
    parser.add_argument(
        "--lookback",
        default="1h",
        help="Jaeger: how far back to look, e.g. 15m, 2h (default 1h)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port (default 8501)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 to expose it)",
    )
    tuning.add_arguments(parser)


def streamlit_command(
    app_args: list[str], *, port: int = DEFAULT_PORT, host: str = "127.0.0.1"
) -> list[str]:
    """`python -m streamlit run` in headless mode (no browser, no telemetry, no reloader),
    through `console.server`: the same command line, and the source is loaded as the
    server starts."""
    return [
        sys.executable,
        "-m",
        "tracedpush.console.server",
        "run",
        str(app_path()),
        "--server.headless=true",
        f"--server.port={port}",
        f"--server.address={host}",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
        "--browser.gatherUsageStats=false",
        "--global.developmentMode=false",
        "--client.toolbarMode=minimal",
        "--",
        *app_args,
    ]


def _absolute(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def app_arguments(args: argparse.Namespace) -> list[str]:
    """The arguments the app itself parses (see console/source.py)."""
    out: list[str] = []
    if args.traces:
        out = [a for p in args.traces for a in ("--traces", _absolute(p))]
    elif args.jaeger:
        out = ["--jaeger", args.jaeger, "--lookback", args.lookback]
        if args.service:
            out += ["--service", args.service]
    if getattr(args, "bench", None):
        out += ["--bench", _absolute(args.bench)]
    if getattr(args, "index_dir", None):
        out += ["--index-dir", _absolute(args.index_dir)]
    return out


def _serve(app_args: list[str], port: int, host: str) -> int:
    try:
        import streamlit  # noqa: F401
    except ImportError:
        print(
            "tracedpush console needs the console extra: pip install 'tracedpush[console]'",
            file=sys.stderr,
        )
        return 2
    shown = "localhost" if host in ("127.0.0.1", "0.0.0.0") else host
    print(f"tracedpush console: http://{shown}:{port}  (Ctrl-C to stop)", flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(streamlit_command(app_args, port=port, host=host), env=env)

    def stop(signum: int, frame: object) -> None:  # SIGTERM to us also stops Streamlit
        raise KeyboardInterrupt

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def serve(
    traces_dir: str | os.PathLike[str], port: int = DEFAULT_PORT, host: str = "127.0.0.1"
) -> int:
    """Serve the console on a traces directory until Ctrl-C (`tracedpush demo` ends here)."""
    return _serve(["--traces", str(Path(traces_dir).expanduser().resolve())], port, host)


def run(args: argparse.Namespace) -> int:
    if not (args.traces or args.jaeger or args.bench):
        print(
            "tracedpush console: give a source: --traces DIR, --jaeger URL or --bench PATH",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if args.jaeger and args.index_dir:
        print("tracedpush console: --index-dir is for trace files, not --jaeger", file=sys.stderr)
        raise SystemExit(2)
    from tracedpush.analysis import index_cache  # (not at import: `--help` stays quick)

    try:
        index_cache.max_size()  # checked before anything starts, not after a build
    except ValueError as exc:
        print(f"tracedpush console: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    tuning.put_in_force(args)  # the server reads them from the environment, as it starts
    for path in [*(args.traces or ()), *([args.bench] if args.bench else [])]:
        if not Path(path).expanduser().exists():
            # Still serve: the app says so and picks the traces up once they appear.
            print(f"note: {path} does not exist yet", file=sys.stderr)
    return _serve(app_arguments(args), args.port, args.host)
