"""The analysis' tuning knobs, from ``TRACEDPUSH_*`` environment variables (read once, at
import, as vLLM reads its ``VLLM_*`` ones): how finely clock offsets are followed over a
run (`analysis.skew.over_time`) and how TPOT's solo forward cost is taken
(`analysis.steps_columns`). Outside the analysis package, so `tracedpush console` shows
and checks them without importing it.

An unset or empty variable keeps the default; a value that does not parse, or is not
positive, stops the command with a message naming the variable (`tracedpush.envs`).
The analysis index keeps the values its results were made with
(`analysis.index.format_key`): an index made with other values is built again.
"""

from __future__ import annotations

from tracedpush.envs import env_float, env_int

# Each knob: its name in the JSON report (`report_json.tuning_in_force`), its variable, its
# default (in the variable's unit) and what it sets (`--help`).
KNOBS: tuple[tuple[str, str, float, str], ...] = (
    ("skew_windows", "TRACEDPUSH_SKEW_WINDOWS", 12,
     "clock offsets per stretch: at most this many windows,"),
    ("skew_min_window_s", "TRACEDPUSH_SKEW_MIN_WINDOW_S", 10.0,
     "each at least this many seconds"),
    ("tpot_solo_epoch_s", "TRACEDPUSH_TPOT_SOLO_EPOCH_S", 60.0,
     "TPOT's solo forward cost: a median per epoch this long,"),
    ("tpot_solo_min_steps", "TRACEDPUSH_TPOT_SOLO_MIN_STEPS", 8,
     "over at least this many one-request steps"),
)  # fmt: skip
_WINDOWS, _MIN_WINDOW, _SOLO_EPOCH, _SOLO_MIN_STEPS = ((env, d) for _, env, d, _ in KNOBS)

# For `--help` (report and console): each variable, its default, what it sets.
HELP = "analysis tuning (environment; docs/report.md, Tuning):\n" + "\n".join(
    f"  {f'{env}={default:g}':<36}{what}" for _name, env, default, what in KNOBS
)


def _positive_int(name: str, default: float) -> int:
    value = env_int(name, int(default))
    if value < 1:
        raise SystemExit(f"{name}={value} must be at least 1")
    return value


def _positive_ns(name: str, default_s: float) -> int:
    value = env_float(name, default_s)
    if not value > 0 or value == float("inf"):
        raise SystemExit(f"{name}={value} must be a positive number of seconds")
    return round(value * 1e9)


WINDOWS = _positive_int(*_WINDOWS)
MIN_WINDOW_NS = _positive_ns(*_MIN_WINDOW)
SOLO_EPOCH_NS = _positive_ns(*_SOLO_EPOCH)
SOLO_MIN_STEPS = _positive_int(*_SOLO_MIN_STEPS)
