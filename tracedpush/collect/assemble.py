"""Spans arriving from several processes -> one whole trace per request, exactly once.

A request's spans reach the collector from the proxy and from each engine's scheduler
and worker processes, each on its own export schedule, in any order. The completeness
rule (docs/collect.md):

* A trace is **complete** as soon as the proxy's root span `tracedpush.request` has
  arrived (it is exported when it ends, after the response) and every span the critical
  path needs for the request's mode (`semconv.REQUIRED_SPANS[mode]`) is there. It is
  handed over for analysis at once and remembered as done.
* A trace that is not complete and has received no span for `timeout_s` **expires**: it
  is counted and dropped (a request that failed before both engines answered, one whose
  spans were lost on the way, one that did not come through the proxy).
* At most `max_pending` traces wait; a new one beyond that evicts (expires) the one idle
  longest, and a trace keeps at most `max_spans` spans. Memory is bounded whatever
  arrives.
* Per-process spans (`engine.steps`, `engine.threads`, `engine.export`) are not
  requests: they go to the store only.
* Spans of a trace already done (a late `kv.handshake`, a duplicate) are ignored here:
  they are in the store, and the metrics counted the trace once.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tracedpush import semconv as sc
from tracedpush.analysis.model import Span

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_PENDING = 10_000
DEFAULT_MAX_SPANS = 1_000  # a request has ~12; more is not one of ours
_PROCESS_SPANS = frozenset(sc.PROCESS_SPANS)


@dataclass(slots=True)
class _Pending:
    spans: dict[str, Span] = field(default_factory=dict)  # span id -> span
    last_s: float = 0.0  # monotonic time of its latest span
    root: Span | None = None


def mode_of(spans: Iterable[Span]) -> str | None:
    """The request's mode: the root's `tracedpush.mode`, else any span's."""
    found = None
    for s in spans:
        m = s.attributes.get(sc.MODE)
        if m in sc.REQUIRED_SPANS:
            if s.name == sc.SPAN_REQUEST:
                return str(m)
            found = str(m)
    return found


def is_complete(root: Span | None, spans: Iterable[Span]) -> bool:
    """The completeness rule of the module docstring, on a trace's spans so far."""
    if root is None:
        return False
    spans = list(spans)
    mode = mode_of([root, *spans])
    if mode is None:
        return False
    names = {s.name for s in spans}
    return all(n in names for n in sc.REQUIRED_SPANS[mode])


class Assembler:
    """Pending traces, thread-safe: `add` returns the traces it completed."""

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_pending: int = DEFAULT_MAX_PENDING,
        *,
        max_spans: int = DEFAULT_MAX_SPANS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_pending = max(1, max_pending)
        self.max_spans = max_spans
        self.clock = clock
        self.completed = 0
        self.expired = 0
        self.late = 0  # spans of traces already done
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # least recently fed first
        self._done: OrderedDict[str, None] = OrderedDict()  # recently completed trace ids
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, spans: Iterable[Span]) -> tuple[list[tuple[str, list[Span]]], int]:
        """Feed spans; returns (traces now complete as (trace id, spans), traces expired
        to make room)."""
        now = self.clock()
        complete: list[tuple[str, list[Span]]] = []
        touched: set[str] = set()
        evicted = 0
        with self._lock:
            for s in spans:
                if s.name in _PROCESS_SPANS:
                    continue
                tid = s.trace_id
                if tid in self._done:
                    self.late += 1
                    continue
                p = self._pending.get(tid)
                if p is None:
                    if len(self._pending) >= self.max_pending:
                        old, _ = self._pending.popitem(last=False)
                        self._remember(old)  # its stragglers must not start it again
                        evicted += 1
                    p = self._pending[tid] = _Pending()
                if len(p.spans) < self.max_spans:
                    p.spans.setdefault(s.span_id, s)
                if s.name == sc.SPAN_REQUEST and p.root is None:
                    p.root = s
                p.last_s = now
                self._pending.move_to_end(tid)
                touched.add(tid)
            for tid in touched:
                p = self._pending.get(tid)
                if p is not None and is_complete(p.root, p.spans.values()):
                    del self._pending[tid]
                    self._remember(tid)
                    complete.append((tid, list(p.spans.values())))
            self.completed += len(complete)
            self.expired += evicted
        return complete, evicted

    def _remember(self, tid: str) -> None:
        self._done[tid] = None
        while len(self._done) > 2 * self.max_pending:
            self._done.popitem(last=False)

    def sweep(self) -> int:
        """Expire traces idle for `timeout_s`; returns how many."""
        deadline = self.clock() - self.timeout_s
        n = 0
        with self._lock:
            while self._pending:
                tid, p = next(iter(self._pending.items()))
                if p.last_s > deadline:
                    break
                del self._pending[tid]
                self._remember(tid)  # its stragglers must not start it again
                n += 1
            self.expired += n
        return n
