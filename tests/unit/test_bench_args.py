"""The benchmark scripts' command lines: `--help` explains every option, and a count
that is not positive stops the script at parsing, naming the flag, before it builds a
run or starts an engine. The parsers are caught as main() parses: nothing runs."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tracedpush.bench.argtypes import positive

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their sibling benches
SCRIPTS = [
    "bench_abba",
    "bench_console",
    "bench_cost",
    "bench_engines",
    "bench_events",
    "bench_overhead",
    "bench_report",
    "reliability",
]


class _Parsed(Exception):
    pass


def _parser(name: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser `name`'s main() builds, caught as it parses (nothing runs)."""
    seen: list[argparse.ArgumentParser] = []

    def caught(self: argparse.ArgumentParser, *_a: object, **_k: object) -> None:
        seen.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    monkeypatch.setattr(sys, "argv", [name])
    module = importlib.import_module(name)
    with pytest.raises(_Parsed):
        module.main()
    return seen[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_explains_every_option(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = _parser(name, monkeypatch)
    assert parser.description
    bare = [
        a.option_strings or [a.dest]
        for a in parser._actions
        if a.help != argparse.SUPPRESS and not a.help and a.dest != "help"
    ]
    assert not bare, f"{name}: options without help: {bare}"


@pytest.mark.parametrize("script", ["bench_report", "bench_console"])
def test_a_count_that_is_not_positive_stops_at_parsing(script: str) -> None:
    got = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--requests", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 2
    assert "argument --requests: must be positive, got '0'" in got.stderr


@pytest.mark.parametrize(
    ("kind", "text", "want"), [(int, "3", 3), (float, "0.5", 0.5), (int, "1", 1)]
)
def test_positive_parses(kind: type, text: str, want: float) -> None:
    assert positive(kind)(text) == want


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [(int, "0", "must be positive"), (float, "-1", "must be positive"),
     (int, "1.5", "expected a number"), (float, "nan", "must be positive")],
)  # fmt: skip
def test_positive_rejects(kind: type, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        positive(kind)(text)
