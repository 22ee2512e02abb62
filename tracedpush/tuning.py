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

WINDOWS_ENV = "TRACEDPUSH_SKEW_WINDOWS"
MIN_WINDOW_ENV = "TRACEDPUSH_SKEW_MIN_WINDOW_S"
SOLO_EPOCH_ENV = "TRACEDPUSH_TPOT_SOLO_EPOCH_S"
SOLO_MIN_STEPS_ENV = "TRACEDPUSH_TPOT_SOLO_MIN_STEPS"

# The JSON report's name of each knob (`report_json.tuning_in_force`), its variable and
# its default, in the variable's unit.
KNOBS: tuple[tuple[str, str, float], ...] = (
    ("skew_windows", WINDOWS_ENV, 12),
    ("skew_min_window_s", MIN_WINDOW_ENV, 10.0),
    ("tpot_solo_epoch_s", SOLO_EPOCH_ENV, 60.0),
    ("tpot_solo_min_steps", SOLO_MIN_STEPS_ENV, 8),
)

# For `--help` (report and console): each variable, its default, what it sets.
HELP = "analysis tuning (environment; docs/report.md, Tuning):\n" + "\n".join(
    f"  {name + '=' + default:<36}{what}"
    for name, default, what in (
        (WINDOWS_ENV, "12", "clock offsets per stretch: at most this many windows,"),
        (MIN_WINDOW_ENV, "10", "each at least this many seconds"),
        (SOLO_EPOCH_ENV, "60", "TPOT's solo forward cost: a median per epoch this long,"),
        (SOLO_MIN_STEPS_ENV, "8", "over at least this many one-request steps"),
    )
)


def _positive_int(name: str, default: int) -> int:
    value = env_int(name, default)
    if value < 1:
        raise SystemExit(f"{name}={value} must be at least 1")
    return value


def _positive_ns(name: str, default_s: float) -> int:
    value = env_float(name, default_s)
    if not value > 0 or value == float("inf"):
        raise SystemExit(f"{name}={value} must be a positive number of seconds")
    return round(value * 1e9)


WINDOWS = _positive_int(WINDOWS_ENV, 12)
MIN_WINDOW_NS = _positive_ns(MIN_WINDOW_ENV, 10.0)
SOLO_EPOCH_NS = _positive_ns(SOLO_EPOCH_ENV, 60.0)
SOLO_MIN_STEPS = _positive_int(SOLO_MIN_STEPS_ENV, 8)
