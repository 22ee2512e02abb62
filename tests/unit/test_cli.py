"""Every command `tracedpush --help` advertises has a working `--help` of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tracedpush.cli import COMMANDS


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracedpush", *args], capture_output=True, text=True, timeout=120
    )


def test_top_level_help_lists_every_command():
    out = run("--help")
    assert out.returncode == 0
    for name in COMMANDS:
        assert name in out.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_explains_itself(name):
    out = run(name, "--help")
    assert out.returncode == 0, out.stderr[-1000:]
    assert "usage: tracedpush " + name in out.stdout
    assert len(out.stdout.splitlines()) > 4  # more than a bare usage line


def test_unknown_command_fails_clearly():
    out = run("nope")
    assert out.returncode == 2
    assert "invalid choice" in out.stderr
