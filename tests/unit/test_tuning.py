"""The analysis' tuning knobs (`tracedpush.tuning`): read from the environment by the real
commands, checked before anything starts, in force in the report, and part of what an
analysis index was made with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracedpush import tuning
from tracedpush.analysis import skew, steps_columns
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.testing import synthetic


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tuning") / "traces"
    synthetic.generate(60, seed=3, clock_offsets_ms={synthetic.DECODE_INSTANCE: 3.0}).write(d)
    return d


def _tracedpush(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracedpush", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _windows(traces: Path, **env: str) -> list[dict]:
    """The JSON report's windows; its ``tuning`` says the values they were made with."""
    got = _tracedpush("report", "--traces", str(traces), "--no-index", "--format", "json", **env)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    knobs = doc["tuning"]
    assert knobs["skew_windows"] == int(env.get("TRACEDPUSH_SKEW_WINDOWS", 12))
    assert knobs["skew_min_window_s"] == float(env.get("TRACEDPUSH_SKEW_MIN_WINDOW_S", 10))
    assert (knobs["tpot_solo_epoch_s"], knobs["tpot_solo_min_steps"]) == (60.0, 8)
    return doc["clock_offsets_over_time"]


def test_windows_follow_the_environment(traces: Path) -> None:
    """The 20 s synthetic run in windows of at least 1 s: 12 by default, 3 when asked."""
    default = _windows(traces, TRACEDPUSH_SKEW_MIN_WINDOW_S="1")
    fewer = _windows(traces, TRACEDPUSH_SKEW_MIN_WINDOW_S="1", TRACEDPUSH_SKEW_WINDOWS="3")
    assert 3 < len(default) <= 12 and 0 < len(fewer) <= 3, (len(default), len(fewer))
    # the windows of at least 10 s (the default) cut the same run into at most 3
    assert 0 < len(_windows(traces)) <= 3


# a bad value of each knob (by its name in `tuning.KNOBS`), and what the error says
BAD = [
    ("skew_windows", "0", "must be at least 1"),
    ("skew_min_window_s", "-5", "must be a positive number of seconds"),
    ("tpot_solo_epoch_s", "a minute", "is not a number"),
    ("tpot_solo_min_steps", "1.5", "is not an integer"),
]
_VARIABLE = {knob: env for knob, env, _default, _what in tuning.KNOBS}


@pytest.mark.parametrize(("knob", "value", "says"), BAD)
def test_a_bad_value_stops_the_command_naming_it(knob: str, value: str, says: str) -> None:
    name = _VARIABLE[knob]
    for command in ("report", "console"):
        got = _tracedpush(command, "--help", **{name: value})
        assert got.returncode != 0 and name in got.stderr and says in got.stderr, got
        assert "Traceback" not in got.stderr


def test_help_lists_the_knobs() -> None:
    for command in ("report", "console"):
        got = _tracedpush(command, "--help")
        assert got.returncode == 0
        for name in ("TRACEDPUSH_SKEW_WINDOWS", "TRACEDPUSH_TPOT_SOLO_MIN_STEPS"):
            assert name in got.stdout, (command, name)


@pytest.mark.parametrize(
    ("module", "knob", "value"),
    [
        (skew, "WINDOWS", 3),
        (skew, "MIN_WINDOW_NS", 10**9),
        (steps_columns, "SOLO_EPOCH_NS", 10 * 10**9),
        (steps_columns, "SOLO_MIN_STEPS", 2),
    ],
)
def test_an_index_made_with_other_values_is_built_again(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module, knob: str, value: int
) -> None:
    idx = AnalysisIndex([traces], index_dir=tmp_path / "index")
    idx.update()
    idx.close()
    same = AnalysisIndex([traces], index_dir=tmp_path / "index")
    same.update()
    assert not same.rebuilt
    same.close()
    monkeypatch.setattr(module, knob, value)
    other = AnalysisIndex([traces], index_dir=tmp_path / "index")
    other.update()
    assert other.rebuilt
    other.close()


def test_tpot_knobs_reach_the_analysis() -> None:
    """TPOT's solo epoch and minimum steps, as the analysis reads them (their effect on a
    breakdown is tested with the constants themselves: tests/unit/test_analysis_columns.py)."""
    code = (
        "from tracedpush.analysis import steps_columns as c\n"
        "print(c.SOLO_EPOCH_NS, c.SOLO_MIN_STEPS)"
    )
    env = {
        **os.environ,
        "TRACEDPUSH_TPOT_SOLO_EPOCH_S": "2.5",
        "TRACEDPUSH_TPOT_SOLO_MIN_STEPS": "3",
    }
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert got.stdout.split() == [str(2_500_000_000), "3"], got.stderr


def test_the_text_report_names_the_knobs_not_at_their_defaults(traces: Path) -> None:
    args = ("report", "--traces", str(traces), "--no-index")
    default = _tracedpush(*args)
    changed = _tracedpush(*args, TRACEDPUSH_SKEW_WINDOWS="3", TRACEDPUSH_TPOT_SOLO_EPOCH_S="2.5")
    assert default.returncode == changed.returncode == 0, changed.stderr
    assert "tuning:" not in default.stdout
    assert (
        "tuning: TRACEDPUSH_SKEW_WINDOWS=3 (default 12), "
        "TRACEDPUSH_TPOT_SOLO_EPOCH_S=2.5 (default 60)" in changed.stdout
    ), changed.stdout[:600]


def _json(traces: Path, *flags: str, **env: str) -> dict:
    got = _tracedpush("report", "--traces", str(traces), "--no-index", "--format", "json",
                      *flags, **env)  # fmt: skip
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def test_flags_set_the_knobs_and_win_over_the_environment(traces: Path) -> None:
    """``--skew-windows 2`` beside ``TRACEDPUSH_SKEW_WINDOWS=5``: 2 windows; the JSON
    report says the values in force, which the flags set."""
    both = _json(traces, "--skew-windows", "2", "--skew-min-window-s", "1",
                 "--tpot-solo-epoch-s", "2.5", "--tpot-solo-min-steps", "3",
                 TRACEDPUSH_SKEW_WINDOWS="5")  # fmt: skip
    assert both["tuning"] == {
        "skew_windows": 2,
        "skew_min_window_s": 1.0,
        "tpot_solo_epoch_s": 2.5,
        "tpot_solo_min_steps": 3,
    }
    assert 0 < len(both["clock_offsets_over_time"]) <= 2
    env_only = _json(traces, "--skew-min-window-s", "1", TRACEDPUSH_SKEW_WINDOWS="5")
    assert env_only["tuning"]["skew_windows"] == 5
    assert 2 < len(env_only["clock_offsets_over_time"]) <= 5


def test_a_flag_makes_the_index_build_again(traces: Path, tmp_path: Path) -> None:
    """An index is made with the values in force: a flag's, as a variable's."""
    args = ("report", "--traces", str(traces), "--index", "--index-dir", str(tmp_path / "i"))
    first, warm = _tracedpush(*args), _tracedpush(*args)
    again = _tracedpush(*args, "--skew-windows", "3")
    assert first.returncode == warm.returncode == again.returncode == 0, again.stderr
    assert "building" not in warm.stderr, warm.stderr
    why = "the one there was made by another version of the analysis or other tuning"
    assert why in again.stderr, again.stderr
    assert "tuning: TRACEDPUSH_SKEW_WINDOWS=3 (default 12)" in again.stdout


@pytest.mark.parametrize(("knob", "value", "says"), BAD)
def test_a_bad_flag_stops_the_command_naming_it(
    traces: Path, knob: str, value: str, says: str
) -> None:
    flag = "--" + knob.replace("_", "-")  # (written out here: `tuning.flag` is what is tested)
    for command in ("report", "console"):
        got = _tracedpush(command, "--traces", str(traces), flag, value)
        assert got.returncode == 2 and f"argument {flag}: " in got.stderr, got.stderr
        assert says in got.stderr and "Traceback" not in got.stderr, got.stderr


def test_console_flags_reach_its_server(traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's server (a Streamlit process) reads the knobs from its environment as
    it imports them: a flag given to `tracedpush console` is there. The server itself is
    not started (a stand-in for `subprocess.Popen` keeps its environment): the console's
    own tests run it (tests/console)."""
    from tracedpush import cli
    from tracedpush.console import command as console_command

    seen: dict[str, str] = {}

    class Server:
        def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
            seen.update(env)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(console_command.subprocess, "Popen", Server)
    # what the command sets is put back after the test (empty: as if unset)
    for _name, env, _default, _what in tuning.KNOBS:
        monkeypatch.setenv(env, "")
    for knob in ("WINDOWS", "MIN_WINDOW_NS", "SOLO_EPOCH_NS", "SOLO_MIN_STEPS"):
        monkeypatch.setattr(tuning, knob, getattr(tuning, knob))
    monkeypatch.setenv("TRACEDPUSH_TPOT_SOLO_MIN_STEPS", "4")
    argv = ["console", "--traces", str(traces), "--skew-windows", "3",
            "--tpot-solo-epoch-s", "2.5"]  # fmt: skip
    assert cli.main(argv) == 0
    assert seen["TRACEDPUSH_SKEW_WINDOWS"] == "3"
    assert seen["TRACEDPUSH_TPOT_SOLO_EPOCH_S"] == "2.5"
    assert seen["TRACEDPUSH_TPOT_SOLO_MIN_STEPS"] == "4"  # not given: the environment's
