"""The analysis' tuning knobs: how finely clock offsets are followed over a run
(`analysis.skew.over_time`) and how TPOT's solo forward cost is taken
(`analysis.steps_columns`). Outside the analysis package, so `tracedpush console` shows
and checks them without importing it.

Each knob is a flag of `tracedpush report` and `tracedpush console` (``--skew-windows
3``) whose default is its ``TRACEDPUSH_*`` variable (read once, at import, as vLLM reads
its ``VLLM_*`` ones), else the built-in value: a flag given wins (`put_in_force`). An
unset or empty variable keeps the default; a value that does not parse, or is not
positive, stops the command with a message naming the variable or the flag.
The analysis index keeps the values its results were made with
(`analysis.index.format_key`): an index made with other values is built again.
"""

from __future__ import annotations

import argparse
import os

from tracedpush.envs import env_str

# Each knob: its name in the JSON report (`report_json.tuning_in_force`; its flag is the
# name with dashes), its variable, its default (in the variable's unit) and what its flag
# sets, in the terms of its metavar (N, or S seconds).
KNOBS: tuple[tuple[str, str, float, str], ...] = (
    ("skew_windows", "TRACEDPUSH_SKEW_WINDOWS", 12,
     "clock offsets over the run: at most N windows"),
    ("skew_min_window_s", "TRACEDPUSH_SKEW_MIN_WINDOW_S", 10.0,
     "... each window at least S seconds long"),
    ("tpot_solo_epoch_s", "TRACEDPUSH_TPOT_SOLO_EPOCH_S", 60.0,
     "TPOT's solo forward cost: a median per epoch of S seconds"),
    ("tpot_solo_min_steps", "TRACEDPUSH_TPOT_SOLO_MIN_STEPS", 8,
     "... over at least N one-request steps, else a neighbour's"),
)  # fmt: skip

# Each knob's value in this module, by name: the analysis modules copy it under that
# name; seconds are kept as ns.
_ATTR = {
    "skew_windows": ("WINDOWS", False),
    "skew_min_window_s": ("MIN_WINDOW_NS", True),
    "tpot_solo_epoch_s": ("SOLO_EPOCH_NS", True),
    "tpot_solo_min_steps": ("SOLO_MIN_STEPS", False),
}

# For `--help` (report and console), after the flags.
HELP = """analysis tuning: the flags above, each defaulting to its TRACEDPUSH_* variable (a
flag given wins); an index made with other values is built again (docs/report.md,
Tuning)."""


def flag(name: str) -> str:
    """A knob's flag: ``skew_min_window_s`` -> ``--skew-min-window-s``."""
    return "--" + name.replace("_", "-")


def _seconds(name: str) -> bool:
    return _ATTR[name][1]


def parse(name: str, text: str) -> int | float:
    """A knob's value from text, in its unit (ValueError saying what is wrong)."""
    if _seconds(name):
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        if not value > 0 or value == float("inf"):
            raise ValueError(f"{value:g} must be a positive number of seconds")
        return value
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if number < 1:
        raise ValueError(f"{number} must be at least 1")
    return number


def _from_env(name: str, env: str, default: float) -> int | float:
    text = env_str(env)
    if text is None:
        return default
    try:
        return parse(name, text)
    except ValueError as exc:
        raise SystemExit(f"{env}={exc}") from None


def _kept(name: str, value: float) -> int:
    """A knob's value as this module keeps it (seconds as ns)."""
    return round(value * 1e9) if _seconds(name) else int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The knobs as flags (`report`, `console`): default None, the environment's value
    then being the one in force."""
    group = parser.add_argument_group(
        "analysis tuning", "default: the TRACEDPUSH_* variable, else the value shown"
    )
    for name, env, default, what in KNOBS:

        def value(text: str, name: str = name) -> int | float:
            try:
                return parse(name, text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        value.__name__ = name  # argparse names the type in some of its messages
        group.add_argument(
            flag(name),
            type=value,
            default=None,
            metavar="S" if _seconds(name) else "N",
            help=f"{what} (${env}, else {default:g})",
        )


def put_in_force(args: argparse.Namespace) -> list[str]:
    """The flags given, put in force in this process (this module's values) and in those
    it starts (the environment: the console's server, a report's helper processes read
    it as they import this module). Returns the knobs given, by name: the analysis
    modules copied the values at import, and `analysis.report_json.take_tuning` brings
    those up to date. A knob not given keeps the value it has (a test's, say)."""
    given = []
    for name, env, _default, _what in KNOBS:
        value = getattr(args, name, None)
        if value is None:
            continue
        os.environ[env] = str(value)  # a float as it round-trips
        globals()[attr(name)] = _kept(name, value)
        given.append(name)
    return given


def attr(name: str) -> str:
    """The module value of knob `name` (the analysis modules copy it under that name)."""
    return _ATTR[name][0]


_INITIAL = {name: _kept(name, _from_env(name, env, d)) for name, env, d, _w in KNOBS}
WINDOWS = _INITIAL["skew_windows"]
MIN_WINDOW_NS = _INITIAL["skew_min_window_s"]
SOLO_EPOCH_NS = _INITIAL["tpot_solo_epoch_s"]
SOLO_MIN_STEPS = _INITIAL["tpot_solo_min_steps"]
