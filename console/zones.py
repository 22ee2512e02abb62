"""The visitor's time zone, for every absolute time the console shows.

Spans carry unix times; a person reads wall-clock times. Streamlit reports the
browser's IANA zone (`st.context.timezone`); the pages show arrival times in it and say
which zone they use. Plotly's date axes have no time zone: they draw a value as the wall
time it spells, so a chart gets its times already converted (`wall_times`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pandas as pd

# IANA names of UTC itself: shown as "UTC", and a UTC day is a date (`export.bucket_label`)
UTC_NAMES = frozenset(
    {"UTC", "Etc/UTC", "UCT", "Etc/UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu"}
)


def zone(name: str | None) -> tzinfo:
    """The zone named `name` (the browser's, an IANA name); UTC when there is none or
    this machine does not know it. UTC's aliases give `datetime.UTC` itself."""
    if not name or name in UTC_NAMES:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def zone_name(tz: tzinfo) -> str:
    return "UTC" if tz is UTC else str(tz)


def wall_times(unix_ms: Any, tz: tzinfo = UTC) -> np.ndarray:
    """Unix times (ms) as naive datetime64 wall times in `tz`, each at the zone's offset
    at that time (across a daylight-saving change the axis steps as the wall clock
    does): what a Plotly date axis draws as the zone's clock."""
    return aware_times(unix_ms, tz).dt.tz_localize(None).to_numpy()


def aware_times(unix_ms: Any, tz: tzinfo = UTC) -> pd.Series:
    """Unix times (ms) as datetimes aware of `tz`, for a table's datetime column (which
    shows them in that zone)."""
    when = pd.to_datetime(pd.Series(unix_ms, dtype="float64"), unit="ms", utc=True)
    return when if tz is UTC else when.dt.tz_convert(tz)


def moment(unix_ms: float, tz: tzinfo = UTC) -> str:
    """One instant to the millisecond, with its zone ("2026-12-04 19:03:21.123 UTC"):
    what to look for in the logs and dashboards of the same moment."""
    seconds, ms = divmod(math.floor(unix_ms), 1000)  # whole ms: no float rounding up
    return f"{datetime.fromtimestamp(seconds, tz=tz):%Y-%m-%d %H:%M:%S}.{ms:03d} {zone_name(tz)}"
