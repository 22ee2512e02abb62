"""The visitor's time zone: names, and unix times as a chart's and a table's times."""

from __future__ import annotations

from datetime import UTC

import numpy as np
import pandas as pd

from tracedpush.console import zones

# 2026-03-08 09:30 and 10:30 UTC: Los Angeles moves from -8 h to -7 h at 10:00 UTC
BEFORE_MS, AFTER_MS = 1_772_962_200_000.0, 1_772_965_800_000.0


def test_zone_names() -> None:
    for unknown in (None, "", "Not/AZone", "../etc"):
        assert zones.zone(unknown) is UTC and zones.zone_name(zones.zone(unknown)) == "UTC"
    for alias in ("UTC", "Etc/UTC", "Zulu"):  # UTC by any name is UTC itself
        assert zones.zone(alias) is UTC
    assert zones.zone_name(zones.zone("Asia/Kolkata")) == "Asia/Kolkata"


def test_wall_times_in_a_zone() -> None:
    ms = [BEFORE_MS, AFTER_MS, np.nan]
    utc = zones.wall_times(ms)
    assert utc[0] == np.datetime64("2026-03-08T09:30") and np.isnat(utc[2])
    kolkata = zones.wall_times(ms, zones.zone("Asia/Kolkata"))
    assert kolkata[0] == np.datetime64("2026-03-08T15:00")
    # the offset at each time: one real hour apart is two on Los Angeles' wall clock
    la = zones.wall_times(ms, zones.zone("America/Los_Angeles"))
    assert list(la[:2]) == [np.datetime64("2026-03-08T01:30"), np.datetime64("2026-03-08T03:30")]


def test_aware_times_keep_the_index() -> None:
    ms = pd.Series([BEFORE_MS, AFTER_MS], index=[7, 3])
    la = zones.aware_times(ms, zones.zone("America/Los_Angeles"))
    assert list(la.index) == [7, 3]
    assert [t.strftime("%H:%M %z") for t in la] == ["01:30 -0800", "03:30 -0700"]
    assert str(zones.aware_times(ms).dt.tz) == "UTC"


def test_a_moment_says_its_zone() -> None:
    assert zones.moment(BEFORE_MS + 7.9996) == "2026-03-08 09:30:00.007 UTC"  # not .008
    kolkata = zones.moment(BEFORE_MS + 7, zones.zone("Asia/Kolkata"))
    assert kolkata == "2026-03-08 15:00:00.007 Asia/Kolkata"
