"""Trace completeness from the engines' own `engine.export` records (export_health).

The records' shape is checked against the real pipeline's in test_telemetry_export.py
(`test_export_and_drop_counters_land_in_the_trace_store`); here, how accounts fold and
what the report says of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze
from tracedpush.analysis.export_health import ExportHealth, account_from_span, fold
from tracedpush.analysis.index import AnalysisIndex
from tracedpush.analysis.model import Resource, Span
from tracedpush.testing import synthetic


def record(pid: str, end_ns: int, exported: int, **more: Any) -> Span:
    attrs: dict[str, Any] = {
        sc.SIDE: more.pop("side", "worker"),
        sc.ENGINE_ID: "decode-engine-001",
        sc.EXPORT_EXPORTER: ["jsonl", "otlp"],
        sc.EXPORT_EXPORTED: [exported, 0],
        sc.EXPORT_FAILING: [False, more.pop("failing", False)],
        sc.EXPORT_DROPPED_QUEUE_FULL: [0, more.pop("queue_full", 0)],
        sc.EXPORT_DROPPED_EXPORT_FAILED: [0, 0],
        sc.EXPORT_DROPPED_STORE_FULL: [0, 0],
        sc.EVENTS_DROPPED: more.pop("events_dropped", 0),
    }
    if "final" in more:
        attrs[sc.EXPORT_FINAL] = more.pop("final")
    res = Resource("vllm-decode", "vllm-decode", "vm", pid)
    return Span("a" * 32, "b" * 16, "", sc.SPAN_ENGINE_EXPORT, 1, 0, end_ns, res, attrs, [])


def health(*spans: Span) -> ExportHealth:
    accounts: dict = {}
    fold(accounts, map(account_from_span, spans))
    return ExportHealth.of(accounts)


def test_the_latest_record_is_the_account_and_a_final_one_stays_final():
    h = health(
        record("7", 30, 90, final=False, queue_full=2),
        record("7", 40, 95, final=True, queue_full=2),
        record("7", 20, 60, final=False),  # an older record read later (another file)
    )
    (acc,) = h.accounts
    assert (acc.exported, acc.lost, acc.final) == (95, 2, True)
    assert h.lines() == [
        "- decode-engine-001 worker (pid 7 on vm): 2 spans dropped (queue_full 2): the phases "
        "of some requests are missing, so per-phase figures may be biased",
        "- 1 of 1 flushed their last spans as they shut down",
    ]
    assert h.to_json()["spans_dropped"] == 2 and h.to_json()["unflushed"] == 0


def test_a_process_without_a_final_record_is_named():
    h = health(
        record("7", 40, 95, final=True),
        record("8", 40, 50, final=False, side="scheduler", failing=True, events_dropped=4),
    )
    assert [a.pid for a in h.unflushed] == ["8"]
    lines = h.lines()
    assert lines[0].startswith("- decode-engine-001 scheduler (pid 8 on vm): 4 events discarded")
    assert lines[1] == "- decode-engine-001 scheduler (pid 8 on vm): its last export to otlp failed"
    assert lines[2].startswith("- 1 of 2 wrote no final record: still running, or killed")
    assert lines[2].endswith(": decode-engine-001 scheduler (pid 8 on vm)")


def test_records_of_an_older_tracedpush_are_not_called_killed():
    h = health(record("7", 40, 95), record("8", 40, 50, side="scheduler"))
    assert h.unflushed == [] and [a.final for a in h.accounts] == [None, None]
    assert h.lines() == [
        "- 2 processes dropped no span (145 exported)",
        "- 2 of 2 do not say whether they flushed as they shut down (written by a tracedpush "
        "older than final records)",
    ]


def test_no_records_no_account():
    assert not health()
    assert health().lines() == ["- no export records (engine.export) in these traces"]


def test_an_engine_process_with_steps_and_no_record_at_all_never_flushed():
    """Killed before its first record (10 s in), or every record lost: its engine steps
    still name it."""
    accounts: dict = {}
    fold(accounts, [account_from_span(record("7", 40, 95, final=True))])
    seen = [
        Resource("vllm-decode", "vllm-decode", "vm", "7"),  # the one that wrote records
        Resource("vllm-prefill", "prefill-engine-001", "vm", "9"),
    ]
    h = ExportHealth.of(accounts, seen)
    assert [(a.pid, a.recorded, a.final) for a in h.unflushed] == [("9", False, False)]
    assert h.lines()[-1].endswith(": prefill-engine-001 (pid 9 on vm) (no record at all)")
    # a tracedpush older than export records: nobody wrote one, nobody is blamed
    assert not ExportHealth.of({}, seen)


def test_the_page_warning_says_what_was_lost_and_nothing_when_nothing_was():
    """The console's banner (`ExportHealth.warning`): lost spans and events, failing
    exporters; a process that did not flush is not warned of on every page."""
    assert health(record("7", 40, 95, final=False)).warning() == ""
    lost = health(
        record("7", 40, 95, final=True, queue_full=1200),
        record("8", 40, 50, final=True, side="scheduler", events_dropped=4),
        record("9", 40, 50, final=True),
    )
    assert lost.warning() == (
        "2 of 3 processes lost 1,200 spans and 4 events: some requests lack phases, "
        "so per-phase figures may be biased."
    )
    failing = health(record("7", 40, 95, final=True, failing=True))
    assert failing.warning() == (
        "The last export of 1 process failed, so spans may be missing from the store."
    )


def test_an_engine_process_that_served_requests_but_wrote_no_process_span_is_named(
    tmp_path: Path,
) -> None:
    """Killed before its first step record and its first export record (both come 1-10 s
    in), a process still left its requests' spans: those name it, in `analyze()` and
    through the analysis index alike."""
    run = synthetic.generate(30, seed=4, modes=("push",))
    run.write(tmp_path / "traces")
    (path,) = (tmp_path / "traces").glob("push/vllm-prefill-p_work-*.jsonl")
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    for doc in docs:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                ss["spans"] = [s for s in ss["spans"] if s["name"] not in sc.PROCESS_SPANS]
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    pid = path.stem.rsplit("-", 1)[1]
    want = analyze(TraceStore.from_path(tmp_path / "traces")).export_health()
    (gone,) = want.unflushed
    assert (gone.pid, gone.recorded, gone.service) == (pid, False, sc.SERVICE_PREFILL)
    assert want.lines()[-1].endswith(f"prefill-0 (pid {pid} on p-host) (no record at all)")
    index = AnalysisIndex([tmp_path / "traces"], index_dir=tmp_path / "index")
    assert index.update().export_health().to_json() == want.to_json()
    index.close()
    warm = AnalysisIndex([tmp_path / "traces"], index_dir=tmp_path / "index")
    assert warm.update().export_health().to_json() == want.to_json()
    warm.close()


def test_a_process_that_says_it_writes_records_and_wrote_none_is_named(tmp_path: Path) -> None:
    """A proxy killed before its first record (10 s in) left only its request spans. Its
    resource says it writes records (`tracedpush.export.records`), so it is named, in
    `analyze()` and through the analysis index alike; a proxy that does not say so (one
    before that attribute, or one with no exporter) is not."""
    run = synthetic.generate(30, seed=4, modes=("push",))
    run.write(tmp_path / "traces")
    assert analyze(TraceStore.from_path(tmp_path / "traces")).export_health().unflushed == []
    (path,) = (tmp_path / "traces").glob("push/tracedpush-proxy-*.jsonl")
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    for doc in docs:
        for rs in doc["resourceSpans"]:
            mark = {"key": sc.RES_EXPORT_RECORDS, "value": {"boolValue": True}}
            rs["resource"]["attributes"].append(mark)
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    pid = path.stem.rsplit("-", 1)[1]
    want = analyze(TraceStore.from_path(tmp_path / "traces")).export_health()
    (gone,) = want.unflushed
    assert (gone.pid, gone.recorded, gone.service) == (pid, False, sc.SERVICE_PROXY)
    assert want.lines()[-1].endswith(
        f": proxy proxy-host:8000 (pid {pid} on proxy-host) (no record at all)"
    )
    for _ in ("cold", "warm"):
        index = AnalysisIndex([tmp_path / "traces"], index_dir=tmp_path / "index")
        assert index.update().export_health().to_json() == want.to_json()
        index.close()


def test_a_marked_process_is_named_even_when_no_process_wrote_a_record() -> None:
    """Every process killed before its first record: the ones that say they write records
    are named; unmarked ones (an older tracedpush) still are not."""
    says = {sc.RES_EXPORT_RECORDS: True}
    marked = Resource("tracedpush-proxy", "127.0.0.1:8000", "vm", "5", says)
    old = Resource("vllm-prefill", "prefill-engine-001", "vm", "9")
    h = ExportHealth.of({}, [marked, old])
    assert [(a.pid, a.recorded) for a in h.unflushed] == [("5", False)]
