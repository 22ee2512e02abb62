"""`tracedpush` command line: one subcommand per module, imported lazily.

Each command module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Modules
are imported only when their command runs, so `tracedpush report` works on a laptop
without vLLM, and `--help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("tracedpush.model.command", "Build the tiny local Qwen2 test model (no network)."),
    "proxy": ("tracedpush.proxy.command", "Run the OpenAI-compatible P/D proxy (push or pull)."),
    "up": ("tracedpush.launcher.command", "Launch a local 1P1D (prefill, decode, proxy)."),
    "demo": ("tracedpush.bench.demo", "Run push then pull on a mixed workload; print a table."),
    "bench": (
        "tracedpush.bench.command",
        "Benchmarks: `bench sweep` runs QPS x input length, push vs pull (vLLM's format).",
    ),
    "report": ("tracedpush.analysis.command", "Analyse traces: critical path, skew, push vs pull."),
    "index": (
        "tracedpush.analysis.index_command",
        "List and prune the analysis indexes kept under TRACEDPUSH_INDEX_ROOT.",
    ),
    "console": ("tracedpush.console.command", "Serve the Streamlit console on a traces source."),
    "collect": (
        "tracedpush.collect.command",
        "Receive OTLP spans: store, forward, TTFT phase metrics with exemplars.",
    ),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracedpush",
        description="Trace vLLM's prefill->decode KV handoff (NIXL push and pull), "
        "request by request.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = (argv or [None])[0] if argv else None
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen command's module is imported; others show their one-line help.
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.version:
        from tracedpush import __version__

        print(f"tracedpush {__version__}")
        return 0
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0 if not args.command else 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
