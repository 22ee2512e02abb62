"""What `analyze()` returns: one `RequestAnalysis` per request, in a `RunAnalysis`.

Data only: the JSON format is rendered by `report_json`, the text report by `report`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracedpush.analysis.failures import Failure, FailureSummary, summarize
from tracedpush.analysis.model import ClockOffset, LoadStats, Segment, SpanView
from tracedpush.analysis.sampling import Sampling
from tracedpush.analysis.sampling import summarize as summarize_sampling

if TYPE_CHECKING:
    from tracedpush.analysis.contention import Contention
    from tracedpush.analysis.steps import EngineSteps


@dataclass(slots=True)
class RequestAnalysis:
    """One request: its TTFT cut into phases, its spans on lanes, what went wrong.

    Times are milliseconds relative to the proxy's receipt of the request, after clock
    correction. ``critical_path`` segments are consecutive from 0 and sum to
    ``ttft_ms``; ``hidden`` holds phases that ran inside the TTFT window without
    delaying the first token (push's registration during prefill, for instance).
    """

    trace_id: str
    request_id: str
    mode: str  # "push", "pull" or "unknown"
    prompt_tokens: int | None
    output_tokens: int | None
    ttft_ms: float | None  # receipt -> first token sent to the client (None: not known)
    tpot_ms: float | None  # (last token - first token) / (output tokens - 1)
    start_unix_ms: float  # proxy receipt, Unix epoch milliseconds
    load: int  # requests in flight at the proxy at receipt (this one included)
    bucket: str  # prompt-length bucket label, e.g. "<=1024"
    critical_path: list[Segment]
    hidden: list[Segment]
    spans: list[SpanView]
    complete: bool  # every span the mode requires is present and the path is whole
    # (a failed phase does not make a trace incomplete: see `error`)
    problems: list[str]
    load_bucket: str = ""  # load bucket label, e.g. "3-4"
    rendezvous_first: str | None = None  # push: "registration" or "prefill"
    error: str | None = None  # "<span>: <error.type>" of the failure the others followed
    lanes: list[str] = field(default_factory=list)  # lane names in display order
    ttft_attr_ms: float | None = None  # the proxy's own tracedpush.ttft_ms attribute
    # every phase each engine measured, on its own clock, on the critical path or not:
    # {"prefill": {phase: ms}, "decode": {phase: ms}} (critical_path.engine_phases)
    engine_phases_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    prefill_steps: int | None = None  # engine steps that computed the prefill (on P)
    # TPOT split over D's engine steps in the decode window (tpot.breakdown): {"model
    # forward", "batch sharing", "connector", "scheduling and other": ms}, sums to tpot_ms
    tpot_breakdown_ms: dict[str, float] | None = None
    # where the request failed (leg, error type, message), when the client did not get a
    # whole answer; None for a request answered, even despite a failed span (`failures`)
    failure: Failure | None = None
    proxy_seen: bool = True  # the trace has the proxy's root span (tracedpush.request)
    # how the proxy sampled it (root span's tracedpush.sampler / .sampler.ratio); the
    # ratio is None when a client's traceparent decided, or none was recorded (sampling.py)
    sampler: str | None = None
    sampling_ratio: float | None = None

    def phase_ms(self) -> dict[str, float]:
        """Critical-path milliseconds per phase (a phase can occur more than once)."""
        out: dict[str, float] = {}
        for seg in self.critical_path:
            out[seg.phase] = out.get(seg.phase, 0.0) + seg.duration_ms
        return out

    def row(self) -> dict[str, Any]:
        """One flat row (see `RunAnalysis.table`)."""
        row: dict[str, Any] = {
            "trace_id": self.trace_id,
            "request_id": self.request_id,
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "start_unix_ms": self.start_unix_ms,
            "load": self.load,
            "load_bucket": self.load_bucket,
            "bucket": self.bucket,
            "complete": self.complete,
            "error": self.error,
        }
        for phase, ms in self.phase_ms().items():
            row[f"critical_ms.{phase}"] = ms
        return row


@dataclass(slots=True)
class RunAnalysis:
    """Every request of a run plus what was estimated across them (clock offsets)."""

    requests: list[RequestAnalysis]
    clock_offsets: dict[str, ClockOffset]
    stats: LoadStats = field(default_factory=LoadStats)
    skew_corrected: bool = True
    buckets: tuple[int, ...] = ()
    load_buckets: tuple[int, ...] = ()
    source: str = ""
    skew_policy: str = "midpoint"
    # per-process step traces (engine.steps / engine.threads), placed on the proxy clock
    engine_steps: EngineSteps | None = field(default=None, repr=False)
    _index: dict[str, RequestAnalysis] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._reindex()

    def _reindex(self) -> None:
        self._index = {}
        for r in self.requests:
            self._index.setdefault(r.request_id, r)
        for r in self.requests:
            self._index[r.trace_id] = r

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[RequestAnalysis]:
        return iter(self.requests)

    def get(self, key: str) -> RequestAnalysis | None:
        """A request by trace id or by base request id."""
        return self._index.get(key) or self._index.get(key.lower())

    def by_mode(self, mode: str) -> list[RequestAnalysis]:
        return [r for r in self.requests if r.mode == mode]

    def modes(self) -> list[str]:
        return sorted({r.mode for r in self.requests})

    def slowest(self, n: int = 10, mode: str | None = None) -> list[RequestAnalysis]:
        rs = [
            r for r in self.requests if r.ttft_ms is not None and (mode is None or r.mode == mode)
        ]
        return sorted(rs, key=lambda r: r.ttft_ms or 0.0, reverse=True)[:n]

    def engine_phase_totals(
        self, *, counts: bool = False
    ) -> dict[str, dict[str, dict[str, float]]]:
        """Sum of ``engine_phases_ms`` over every request: {mode: {engine role: {phase:
        total ms}}} (``counts=True``: how many requests measured each phase). Compare
        with the growth of each engine's vLLM counters over the run, e.g. P's queue wait
        with vllm:request_queue_time_seconds_sum, prefill compute with
        vllm:request_prefill_time_seconds_sum, WRITE / READ with
        vllm:nixl_xfer_time_seconds_sum."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for r in self.requests:
            per_mode = out.setdefault(r.mode, {})
            for role, phases in r.engine_phases_ms.items():
                acc = per_mode.setdefault(role, {})
                for p, v in phases.items():
                    acc[p] = acc.get(p, 0) + (1 if counts else v)
        return out

    def table(self) -> list[dict[str, Any]]:
        """One flat row per request: ids, mode, tokens, TTFT/TPOT, start, load, bucket,
        and ``critical_ms.<phase>`` per phase on the critical path (absent: 0 ms)."""
        return [r.row() for r in self.requests]

    def sampling(self) -> Sampling:
        """The ratios the traces were sampled at, and which traces the comparison's
        statistics use so that they stay unbiased (`sampling`)."""
        return summarize_sampling(self.requests)

    def failures(self) -> FailureSummary:
        """Failed requests by leg and type, and the requests answered despite a failed
        span, incomplete, or without the proxy's span (`failures.summarize`)."""
        return summarize(self.requests)

    def contention(self, *, event_cost_us: float | None = None) -> Contention:
        """CPU per engine process and thread, cores, findings (`contention`)."""
        from tracedpush.analysis.contention import contention

        return contention(self.engine_steps or [], event_cost_us=event_cost_us)
