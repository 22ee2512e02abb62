"""The synthetic generator's engine-step helpers: exactly what they replaced.

``_Intervals.busy` sums only the step intervals that may meet a sample window; the full sum
(`_busy`) is the reference, to the last bit, for ordered and unordered intervals.
`_decode_steps` keeps D's active and waiting requests as time advances; the version
that scanned every request for every step (kept below) is its reference, step for step."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from tracedpush.testing.synthetic.steps import _busy, _decode_steps, _Intervals, _Req, _Step


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
        busy = _Intervals(intervals)
        for _ in range(500):
            t0 = rng.uniform(-20.0, 5_100.0)
            t1 = t0 + rng.choice([0.0, 0.5, 10.0, 250.0, 6_000.0])
            want = _busy(intervals, t0, t1)
            got = busy.busy(t0, t1)
            assert got == want and isinstance(got, float), (ordered, t0, t1)


def _reqs(rng: random.Random, n: int, mode: str) -> list[_Req]:
    """Requests with D's times as the generator makes them, gaps and bursts included,
    some without a first token or an arrival on D."""
    out, t = [], 0.0
    for i in range(n):
        t += rng.choice([0.5, 3.0, 40.0, 400.0]) * rng.random()
        arrival = t + rng.uniform(1.0, 20.0)
        first = arrival + rng.uniform(0.5, 60.0) if rng.random() > 0.03 else None
        end = (first or arrival) + rng.uniform(5.0, 300.0)
        r = _Req(i, t, end, outs=rng.randint(1, 64))
        r.d_arrival = arrival if rng.random() > 0.03 else None
        r.d_first = first
        if mode == "pull" and first is not None:
            r.d_desc_prep = (first - 2.0, first - 2.0 + rng.uniform(0.01, 0.5))
            r.d_loaded = first - rng.uniform(0.1, 1.0)
        if mode == "push" and first is not None and rng.random() > 0.5:
            r.d_loaded = first - rng.uniform(0.1, 1.0)
        out.append(r)
    return out


@pytest.mark.parametrize("mode", ["push", "pull"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_decode_steps_equal_the_scan_of_every_request(mode: str, seed: int) -> None:
    reqs = _reqs(random.Random(seed), 300, mode)
    got = _decode_steps(reqs, mode)
    want = _decode_steps_reference(reqs, mode)
    assert len(got) > 100 and got == want


def _decode_steps_reference(reqs: Sequence[_Req], mode: str) -> list[_Step]:
    """The generator's `_decode_steps` before 2026-12-03, as it was (it scanned every
    request for every step): the reference the incremental one must equal."""
    if not reqs:
        return []
    steps: list[_Step] = []
    t = min(r.d_arrival or r.d_first or r.start for r in reqs)
    t_end = max(r.end for r in reqs)
    prep = sorted((r.d_desc_prep for r in reqs if r.d_desc_prep), key=lambda x: x[0])
    loaded = sorted(r.d_loaded for r in reqs if r.d_loaded is not None)
    pi = li = 0
    by_first = sorted(reqs, key=lambda r: r.d_first or 0.0)
    while t < t_end:
        active = [r for r in by_first if (r.d_first or 0.0) - 1.0 <= t < r.end - 0.2]
        waiting = mode == "push" and any(
            (r.d_arrival or 0.0) <= t < (r.d_first or 0.0) for r in reqs
        )
        starts = 0
        load_ms = 0.0
        while pi < len(prep) and prep[pi][0] <= t:
            load_ms += prep[pi][1] - prep[pi][0] + 0.05
            starts += 1
            pi += 1
        finished = 0
        while li < len(loaded) and loaded[li] <= t:
            finished += 1
            li += 1
        if not active:
            if waiting or load_ms:
                dur = 0.1 + load_ms
                steps.append(
                    _Step(
                        t,
                        dur,
                        0.09 + load_ms,
                        load_ms=load_ms,
                        results_ms=0.08,
                        loads_started=starts,
                        loads_finished=finished,
                    )
                )
                t += 5.0 if not load_ms else dur + 0.05
                continue
            nxt = [x for r in reqs for x in (r.d_arrival or 0.0, (r.d_first or 0.0) - 1.0) if x > t]
            nxt += [p[0] for p in prep[pi:]] + loaded[li:]
            if not nxt:
                break
            t = min(nxt) + 1e-3
            continue
        period = sum(r.tpot for r in active) / len(active)
        results = 0.05 + 0.01 * len(active) + (0.1 if mode == "push" else 0.0)
        connector = 0.02 + results + load_ms
        gap = 0.1 * period
        forward = max(period - gap - connector, 0.3)
        steps.append(
            _Step(
                t,
                forward + connector,
                connector,
                decode_reqs=len(active),
                num_reqs=len(active),
                load_ms=load_ms,
                results_ms=results,
                loads_started=starts,
                loads_finished=finished,
            )
        )
        t += max(period, forward + connector + 0.05)
    return steps
