"""The JSON report format (docs/report.md, `tracedpush report --format json`).

A renderer, beside `report` (text) and `perfetto`: it reads the analysis' data
(`results`), the comparison and the contention findings, and none of them read it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from tracedpush import tuning
from tracedpush.analysis import forked, skew, steps_columns
from tracedpush.analysis.compare import compare
from tracedpush.analysis.model import round_ms
from tracedpush.analysis.results import LazyRequests, RequestAnalysis, RunAnalysis

try:
    from msgspec import DecodeError
    from msgspec.json import format as _reindent
except ImportError:  # pragma: no cover - a declared dependency; without it, the slow way
    _reindent = None

# bump when docs/report.md's JSON format changes incompatibly; added fields (issue 11's
# `failure` per request and `failures` per run, issue 12's `sampling` and `tuning`) keep it
JSON_VERSION = 2
_compact = json.JSONEncoder(separators=(",", ":")).encode


def indented(doc: Any) -> str:
    """``json.dumps(doc, indent=1)``, byte for byte, about 3 times faster: Python indents
    in its pure-Python encoder, so the C encoder writes the compact text and msgspec
    (in C) indents it, keeping every string and number as written. A document msgspec
    cannot read (a NaN, which is not JSON) goes the slow way."""
    if _reindent is not None:
        try:
            return _reindent(_compact(doc).encode(), indent=1).decode()
        except DecodeError:
            pass
    return json.dumps(doc, indent=1)


def request_json(r: RequestAnalysis, *, spans: bool = False) -> dict[str, Any]:
    """One request as the report's ``requests[]`` entry."""
    out: dict[str, Any] = {
        "trace_id": r.trace_id,
        "request_id": r.request_id,
        "mode": r.mode,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "ttft_ms": round_ms(r.ttft_ms),
        "tpot_ms": round_ms(r.tpot_ms),
        "start_unix_ms": round(r.start_unix_ms, 3),
        "load": r.load,
        "load_bucket": r.load_bucket,
        "bucket": r.bucket,
        "complete": r.complete,
        "problems": list(r.problems),
        "error": r.error,
        "failure": None if r.failure is None else r.failure.to_json(),
        "rendezvous_first": r.rendezvous_first,
        "critical_path": [s.to_json() for s in r.critical_path],
        "hidden": [s.to_json() for s in r.hidden],
        "engine_phases_ms": {
            role: {p: round(v, 4) for p, v in d.items()} for role, d in r.engine_phases_ms.items()
        },
        "prefill_steps": r.prefill_steps,
        "sampler": r.sampler,
        "sampling_ratio": r.sampling_ratio,
        "tpot_breakdown_ms": None
        if r.tpot_breakdown_ms is None
        else {k: round(v, 4) for k, v in r.tpot_breakdown_ms.items()},
    }
    if spans:
        out["spans"] = [s.to_json() for s in r.spans]
    return out


def run_json(run: RunAnalysis, *, spans: bool = False) -> dict[str, Any]:
    """The whole documented report: requests, offsets, comparison, steps, contention."""
    return _document(run, [request_json(r, spans=spans) for r in run.requests])


def write_json(
    run: RunAnalysis,
    out: TextIO,
    *,
    spans: bool = False,
    progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> None:
    """Write ``json.dumps(run_json(run, spans=spans), indent=1)`` to `out`, its requests
    a batch at a time (`LazyRequests.stream`): the report of a whole big run without its
    requests, their dicts or the text held at once (200,000 requests: 9.1 GB that way,
    1.1 GB this way). Requests the analysis index makes are made and encoded on
    `workers` cores (default: `export_workers`), a batch each in a forked process
    (`LazyRequests.mapped`): call it with more than one from a process without threads
    (the CLI's; not the console's server). `progress(written, total)`: after every
    `PROGRESS_EVERY` requests and the last."""
    head, tail = json.dumps(_document(run, _REQUESTS), indent=1).split(json.dumps(_REQUESTS))
    out.write(head)
    requests = run.requests
    total = len(requests)
    parts: Iterable[tuple[int, str]]
    if workers is None:
        workers = export_workers(total)
    if isinstance(requests, LazyRequests) and workers > 1:
        texts = functools.partial(_texts, spans=spans)
        parts = requests.mapped(texts, workers, step=min(PARALLEL_STEP, PROGRESS_EVERY))
    else:
        each = requests.stream() if isinstance(requests, LazyRequests) else iter(requests)
        parts = ((1, _texts([r], spans=spans)) for r in each)
    sep = "[\n  "
    for n, text in forked.reported(parts, total, PROGRESS_EVERY, progress):
        if n:  # an item of the list at depth 2, as `json.dumps` has it
            out.write(sep + text)
            sep = ",\n  "
    out.write("[]" if sep.startswith("[") else "\n ]")
    out.write(tail)


def export_workers(requests: int) -> int:
    """Cores for writing `requests` made by the analysis index: every core, from
    `PARALLEL_MIN` requests (fewer take under a few seconds on one)."""
    return forked.cores() if requests >= PARALLEL_MIN else 1


def _texts(requests: list[RequestAnalysis], *, spans: bool) -> str:
    """The requests as items of the report's list (at depth 2), without the separator
    before the first."""
    return ",\n  ".join(
        indented(request_json(r, spans=spans)).replace("\n", "\n  ") for r in requests
    )


PROGRESS_EVERY = 10_000  # requests between two `write_json` progress calls (about 4 s)
PARALLEL_MIN = 5_000  # requests from which `write_json` makes them on every core
PARALLEL_STEP = 2_000  # requests a forked worker makes and encodes at a time (about 7 MB)
# where `write_json` puts the requests, written one by one (a string no report holds)
_REQUESTS = "\0requests\0"


def tuning_in_force() -> dict[str, float | int]:
    """The knobs the analysis uses (`tracedpush.tuning`: its modules' own values, which a
    test may have changed), by `tuning.KNOBS` name, in the variables' units."""
    values = (
        skew.WINDOWS,
        skew.MIN_WINDOW_NS / 1e9,
        steps_columns.SOLO_EPOCH_NS / 1e9,
        steps_columns.SOLO_MIN_STEPS,
    )
    return {name: v for (name, *_), v in zip(tuning.KNOBS, values, strict=True)}


def take_tuning(given: list[str]) -> None:
    """Bring the analysis modules' copies (made at their import) of the knobs `given` by
    name up to date with `tuning`'s, which `tuning.put_in_force` set from the flags."""
    module = {
        "skew_windows": skew,
        "skew_min_window_s": skew,
        "tpot_solo_epoch_s": steps_columns,
        "tpot_solo_min_steps": steps_columns,
    }
    for name in given:
        attr = tuning.attr(name)
        setattr(module[name], attr, getattr(tuning, attr))


def tuning_changed() -> list[str]:
    """Each knob not at its default, as ``VAR=value (default d)``: the report's summary
    and the console's pages name them (results depend on them)."""
    knobs = tuning_in_force()
    return [f"{env}={knobs[k]:g} (default {d:g})" for k, env, d, _ in tuning.KNOBS if knobs[k] != d]


def _document(run: RunAnalysis, requests: Any) -> dict[str, Any]:
    return {
        "version": JSON_VERSION,
        "source": run.source,
        "skew_corrected": run.skew_corrected,
        "skew_policy": run.skew_policy,
        "tuning": tuning_in_force(),
        "load_stats": run.stats.to_json(),
        "clock_offsets_ms": {k: v.to_json() for k, v in run.clock_offsets.items()},
        "clock_offsets_over_time": [w.to_json() for w in run.clock_windows],
        "sampling": run.sampling().to_json(),
        "requests": requests,
        "failures": run.failures().to_json(),
        "comparison": compare(run).to_json(),
        "engine_steps": run.steps_summary(),
        "contention": run.contention().to_json(),
        "trace_completeness": run.export_health().to_json(),
    }
