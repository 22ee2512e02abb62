"""The synthetic generator's engine-step helpers: exactly what they replaced.

`_Busy` sums only the step intervals that may meet a sample window; the full sum
(`_busy`) is the reference, to the last bit, for ordered and unordered intervals."""

from __future__ import annotations

import random

from tracedpush.testing.synthetic.steps import _Busy, _busy


def _intervals(rng: random.Random, n: int, ordered: bool) -> list[tuple[float, float]]:
    out, t = [], 0.0
    for _ in range(n):
        t += rng.uniform(0.0, 5.0)
        out.append((t, t + rng.uniform(0.0, 12.0)))  # some overlap the next ones
    if not ordered:
        rng.shuffle(out)
    return out


def test_busy_sums_exactly_what_the_full_sum_does():
    rng = random.Random(11)
    for ordered in (True, False):
        intervals = _intervals(rng, 2_000, ordered)
        busy = _Busy(intervals)
        for _ in range(500):
            t0 = rng.uniform(-20.0, 5_100.0)
            t1 = t0 + rng.choice([0.0, 0.5, 10.0, 250.0, 6_000.0])
            want = _busy(intervals, t0, t1)
            got = busy(t0, t1)
            assert got == want and isinstance(got, float), (ordered, t0, t1)
