"""Which requests to put side by side: the comparable request of the other mode.

This picks what to draw; it computes nothing about the requests themselves (their
prompt length and load come from the analysis).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def distance(a: Any, b: Any) -> float:
    """Prompt length ratio first, load second (both on a log scale)."""
    pa, pb = (a.prompt_tokens or 0) + 1, (b.prompt_tokens or 0) + 1
    la, lb = max(a.load, 1), max(b.load, 1)
    return abs(math.log2(pa / pb)) + 0.5 * abs(math.log2(la / lb))


def counterpart(req: Any, candidates: Iterable[Any], mode: str | None = None) -> Any | None:
    """The request of ``mode`` (default: any other mode) nearest in prompt length and load;
    complete requests with a TTFT are preferred."""
    pool = [
        c
        for c in candidates
        if c.mode != req.mode and (mode is None or c.mode == mode) and c.ttft_ms is not None
    ]
    if not pool:
        return None
    return min(pool, key=lambda c: (not c.complete, distance(req, c), c.start_unix_ms))


def typical(requests: Iterable[Any], mode: str | None = None) -> Any | None:
    """A complete request of ``mode`` with the median TTFT: a representative default."""
    pool = [r for r in requests if r.ttft_ms is not None and (mode is None or r.mode == mode)]
    complete = [r for r in pool if r.complete] or pool
    if not complete:
        return None
    return sorted(complete, key=lambda r: r.ttft_ms)[len(complete) // 2]


MODE_RANK = {"push": 0, "pull": 1}


def mode_order(modes: Iterable[str]) -> list[str]:
    """push, pull, then any other mode alphabetically."""
    return sorted(set(modes), key=lambda m: (MODE_RANK.get(m, 2), m))


def in_mode_order(requests: Iterable[Any]) -> list[Any]:
    return sorted(
        (r for r in requests if r is not None), key=lambda r: (MODE_RANK.get(r.mode, 2), r.mode)
    )
