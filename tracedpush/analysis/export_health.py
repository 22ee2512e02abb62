"""Were the traces complete? What each process's own export records say.

Every engine process (scheduler side and each worker), and the proxy, writes
`engine.export` records (docs/spans.md): cumulative counts of the spans it delivered and
dropped, by reason, and a last one as it shuts down (`tracedpush.export.final`). So the
store itself says:

* spans some exporter dropped (its queue full, the collector down, the disk full): the
  per-phase figures of the run may then lack some requests' phases;
* events the span builder discarded because it fell behind;
* a process with no final record: still running, or killed before it flushed (vLLM's
  default `--shutdown-timeout 0` does that), so its requests in flight at the end may
  lack their last spans.

Counts are cumulative, so a process's latest record is its account (`fold`); a record
lost to a full disk is made up for by the next one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tracedpush import semconv as sc
from tracedpush.analysis.model import Resource, Span

Key = tuple[str, str, str, str]  # (service, host, pid, side)
_ENGINE_SERVICES = frozenset({sc.SERVICE_PREFILL, sc.SERVICE_DECODE})


def writes_records(r: Resource) -> bool:
    """The process says it writes export records (`RES_EXPORT_RECORDS`; before that
    attribute, only engine processes were known to)."""
    return r.attributes.get(sc.RES_EXPORT_RECORDS) is True


def accountable(resources: Iterable[Resource]) -> list[Resource]:
    """One resource per process among the request spans' (service, host, pid) that must
    have an account: engine processes (by service), and any that says it writes records
    (the proxy too, engines renamed by OTEL_SERVICE_NAME)."""
    out: dict[tuple[str, str, str], Resource] = {}
    for r in resources:
        if r.service in _ENGINE_SERVICES or writes_records(r):
            out.setdefault((r.service, r.host, r.pid), r)
    return [out[k] for k in sorted(out)]


@dataclass(slots=True, frozen=True)
class ExportAccount:
    """One process's latest `engine.export` record (an engine process, or the proxy)."""

    service: str
    host: str
    pid: str
    side: str  # "scheduler" | "worker" (| "" when the record does not say)
    engine_id: str
    end_ns: int  # when it was written (the process's clock)
    exported: int  # spans delivered, summed over its exporters
    dropped: Mapping[str, int] = field(default_factory=dict)  # reason -> spans, summed
    events_dropped: int = 0
    failing: tuple[str, ...] = ()  # exporters whose last attempt failed
    final: bool | None = False  # it wrote its last record as it shut down (None: its
    # records do not say, as an older tracedpush wrote them)
    recorded: bool = True  # False: seen in its process or request spans, with no record

    @property
    def key(self) -> Key:
        return (self.service, self.host, self.pid, self.side)

    @property
    def name(self) -> str:
        side = f" {self.side}" if self.side else ""
        who = self.engine_id or self.service
        if self.service == sc.SERVICE_PROXY:
            who = f"proxy {self.engine_id}".rstrip()
        return f"{who}{side} (pid {self.pid} on {self.host})"

    @property
    def lost(self) -> int:
        return sum(self.dropped.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "host": self.host,
            "pid": self.pid,
            "side": self.side,
            "engine_id": self.engine_id,
            "exported": self.exported,
            "dropped": dict(self.dropped),
            "events_dropped": self.events_dropped,
            "failing": list(self.failing),
            "final": self.final,
            "recorded": self.recorded,
        }


def _ints(value: Any) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return []


def account_from_span(s: Span) -> ExportAccount:
    """An `engine.export` span as its process's account."""
    a = s.attributes
    names = [str(n) for n in a.get(sc.EXPORT_EXPORTER) or ()]
    failing = a.get(sc.EXPORT_FAILING) or ()
    dropped = {reason: sum(_ints(a.get(key))) for reason, key in sc.EXPORT_DROPPED.items()}
    events = a.get(sc.EVENTS_DROPPED)
    return ExportAccount(
        service=s.resource.service,
        host=s.resource.host,
        pid=s.resource.pid,
        side=str(a.get(sc.SIDE) or ""),
        engine_id=str(a.get(sc.ENGINE_ID) or ""),
        end_ns=s.end_ns,
        exported=sum(_ints(a.get(sc.EXPORT_EXPORTED))),
        dropped={r: n for r, n in dropped.items() if n},
        events_dropped=int(events) if isinstance(events, (int, float)) else 0,
        failing=tuple(n for n, f in zip(names, failing, strict=False) if f is True),
        final=(a.get(sc.EXPORT_FINAL) is True) if sc.EXPORT_FINAL in a else None,
    )


def fold(into: dict[Key, ExportAccount], accounts: Iterable[ExportAccount]) -> None:
    """Keep each process's latest account; a final record anywhere stays final."""
    for acc in accounts:
        had = into.get(acc.key)
        if had is None:
            into[acc.key] = acc
            continue
        latest = acc if acc.end_ns >= had.end_ns else had
        final = True if (acc.final or had.final) else latest.final
        into[acc.key] = latest if latest.final == final else replace(latest, final=final)


def _processes(n: int) -> str:
    return "process" if n == 1 else "processes"


@dataclass(slots=True)
class ExportHealth:
    """Every process's account (engine processes and the proxy), by engine, side and pid."""

    accounts: list[ExportAccount]

    @classmethod
    def of(
        cls, accounts: Mapping[Key, ExportAccount], seen: Iterable[Resource] = ()
    ) -> ExportHealth:
        """`seen`: the processes' resources (of their process spans, and `accountable`
        ones of request spans). One with no record at all (killed before its first, 10
        s in, or every one lost) gets an empty account, never flushed; unless no process
        wrote one and it does not say it writes them (a tracedpush older than export
        records)."""
        out = list(accounts.values())
        have = {(a.service, a.host, a.pid) for a in out}
        recorded = bool(out)
        for r in seen:
            if (recorded or writes_records(r)) and (r.service, r.host, r.pid) not in have:
                have.add((r.service, r.host, r.pid))
                out.append(
                    ExportAccount(r.service, r.host, r.pid, "", r.instance, 0, 0, recorded=False)
                )
        return cls(sorted(out, key=lambda a: (a.engine_id, a.side, a.host, a.pid)))

    def __bool__(self) -> bool:
        return bool(self.accounts)

    @property
    def lossy(self) -> list[ExportAccount]:
        return [a for a in self.accounts if a.lost or a.events_dropped]

    @property
    def unflushed(self) -> list[ExportAccount]:
        return [a for a in self.accounts if a.final is False]

    @property
    def failing(self) -> list[ExportAccount]:
        return [a for a in self.accounts if a.failing]

    def warning(self) -> str:
        """One sentence for the top of a page when spans were lost or an exporter is
        failing ("" when neither): the figures below may be biased."""
        parts = []
        if self.lossy:
            spans = sum(a.lost for a in self.lossy)
            events = sum(a.events_dropped for a in self.lossy)
            what = " and ".join(
                x for x in (spans and f"{spans:,} spans", events and f"{events:,} events") if x
            )
            n = len(self.accounts)
            parts.append(
                f"{len(self.lossy)} of {n} {_processes(n)} lost {what}: some requests lack "
                "phases, so per-phase figures may be biased"
            )
        if self.failing:
            n = len(self.failing)
            parts.append(
                f"the last export of {n} {_processes(n)} failed, so spans may be missing "
                "from the store"
            )
        said = "; ".join(parts)
        return f"{said[:1].upper()}{said[1:]}." if parts else ""

    def lines(self) -> list[str]:
        """What the report says: one line when all is well, else one per process."""
        if not self.accounts:
            return ["- no export records (engine.export) in these traces"]
        n = len(self.accounts)
        out = []
        for a in self.lossy:
            why = ", ".join(f"{reason} {k:,}" for reason, k in sorted(a.dropped.items()))
            parts = [f"{a.lost:,} spans dropped ({why})"] if a.lost else []
            if a.events_dropped:
                parts.append(f"{a.events_dropped:,} events discarded by its span builder")
            out.append(
                f"- {a.name}: {'; '.join(parts)}: the phases of some requests are missing, "
                "so per-phase figures may be biased"
            )
        for a in self.failing:
            out.append(f"- {a.name}: its last export to {', '.join(a.failing)} failed")
        if not self.lossy:
            exported = sum(a.exported for a in self.accounts)
            out.append(f"- {n} {_processes(n)} dropped no span ({exported:,} exported)")
        gone = self.unflushed
        unknown = sum(a.final is None for a in self.accounts)
        if unknown:
            out.append(
                f"- {unknown} of {n} do not say whether they flushed as they shut down "
                "(written by a tracedpush older than final records)"
            )
        if gone:
            names = ", ".join(a.name + ("" if a.recorded else " (no record at all)") for a in gone)
            out.append(
                f"- {len(gone)} of {n} wrote no final record: still running, or killed before "
                f"they flushed (their requests in flight at the end may lack spans): {names}"
            )
        elif not unknown:
            out.append(f"- {n} of {n} flushed their last spans as they shut down")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "processes": [a.to_json() for a in self.accounts],
            "spans_dropped": sum(a.lost for a in self.accounts),
            "unflushed": len(self.unflushed),
        }
