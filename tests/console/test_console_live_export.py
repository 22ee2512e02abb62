"""Live page (tails a growing directory) and Export page (CSV, Perfetto JSON)."""

from __future__ import annotations

import io
import json
import re
import time

import numpy as np
import pandas as pd

from tracedpush.analysis import TraceStore, analyze, compare, to_perfetto
from tracedpush.console import data, export, zones
from tracedpush.testing import synthetic
from tracedpush.testing.console import no_exception
from tracedpush.testing.synthetic import generate


def _metrics(at):
    return {m.label: m.value for m in at.metric}


def test_live_picks_up_new_traces(app, tmp_path):
    now = time.time()
    generate(40, seed=11, start_unix_s=now - 240).write(tmp_path / "first")
    at = app(traces=tmp_path, page="views/live.py")
    no_exception(at)
    assert _metrics(at)["push requests"] == "20"
    window = analyze(TraceStore.from_path(tmp_path))
    p50 = compare(window).overall.ttft["push"]["p50"]
    assert any(f"{p50:,.1f} ms" in md.value for md in at.markdown)

    generate(60, seed=12, start_unix_s=now - 120).write(tmp_path / "second")
    for _ in range(20):  # the fragment refreshes on every run; allow a background pass
        at.run()
        if _metrics(at)["push requests"] == "50":
            break
        time.sleep(0.2)
    no_exception(at)
    assert _metrics(at)["push requests"] == "50"
    assert _metrics(at)["pull requests"] == "50"
    assert any("+" in c.value and "spans" in c.value for c in at.caption)


def test_live_catches_up_when_the_clocks_move(app, tmp_path, monkeypatch):
    """New traces that move the clock offsets: each Live refresh analyses the earlier
    requests again a few at a time (not all at once), says how many are still on the
    previous offsets, and ends on `analyze()`'s figures."""
    monkeypatch.setattr(data, "REANALYSE_PER_REFRESH", 5)
    hosts = {
        synthetic.PROXY_INSTANCE: "h-proxy",
        synthetic.PREFILL_INSTANCE: "h-prefill",
        synthetic.DECODE_INSTANCE: "h-decode",
    }
    now = time.time()
    first = {synthetic.DECODE_INSTANCE: 20.0}
    generate(40, seed=11, start_unix_s=now - 240, clock_offsets_ms=first, hosts=hosts).write(
        tmp_path / "first"
    )
    at = app(traces=tmp_path, page="views/live.py")
    no_exception(at)
    # D's clock 1 ms further ahead: within what the pairs allow, so D's offset moves (4 ms
    # less ahead, as before `skew.settle`, now leaves the run's offset where it was)
    later = {synthetic.DECODE_INSTANCE: 21.0}
    generate(10, seed=12, start_unix_s=now - 60, clock_offsets_ms=later, hosts=hosts).write(
        tmp_path / "second"
    )
    behind = []
    for _ in range(60):
        at.run()
        caption = " ".join(c.value for c in at.caption)
        got = re.search(r"([\d,]+) older requests are still analysed", caption)
        behind.append(int(got.group(1).replace(",", "")) if got else 0)
        if _metrics(at)["push requests"] == "25" and not got:
            break
        time.sleep(0.1)
    no_exception(at)
    assert _metrics(at)["push requests"] == "25"
    caught_up = [n for n in behind if n]
    assert caught_up and caught_up[0] >= 30  # 40 moved, 5 a refresh
    assert caught_up == sorted(caught_up, reverse=True) and behind[-1] == 0
    p50 = compare(analyze(TraceStore.from_path(tmp_path))).overall.ttft["push"]["p50"]
    assert any(f"{p50:,.1f} ms" in md.value for md in at.markdown)


def test_live_window_excludes_old_requests(app, tmp_path):
    now = time.time()
    generate(40, seed=13, start_unix_s=now - 3600).write(tmp_path / "old")
    generate(20, seed=14, start_unix_s=now - 60).write(tmp_path / "new")
    at = app(traces=tmp_path, page="views/live.py")
    no_exception(at)
    assert _metrics(at)["push requests"] == "10"  # the last 5 minutes only


def test_export_csv_is_the_analysis_table(traces, expected):
    frame = pd.read_csv(io.BytesIO(export.table_csv(pd.DataFrame(expected.table()))))
    assert len(frame) == len(expected.requests)
    assert set(frame["trace_id"]) == {r.trace_id for r in expected.requests}
    assert "critical_ms.WRITE" in frame.columns


def test_export_perfetto_is_analysis_output(expected):
    ids = [expected.requests[0].trace_id]
    assert json.loads(export.perfetto_json(expected, ids)) == json.loads(
        json.dumps(to_perfetto(expected, ids))
    )


def test_export_page_offers_both_downloads_of_the_chosen_requests(app, traces, expected):
    """One choice of requests for both downloads: the selected one (the default when a
    request is selected), the slowest 50, a window, or all."""
    req = expected.by_mode("pull")[0]
    at = app(traces=traces[0], page="views/export.py", query={"request": req.trace_id})
    no_exception(at)
    assert at.radio(key="export_scope").value == "selected request"
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download CSV (1 requests)", "Download Perfetto JSON (1 requests)"]
    assert at.dataframe[0].value["trace_id"].tolist() == [req.trace_id]
    at.radio(key="export_scope").set_value("slowest 50").run()
    slowest = {r.trace_id for r in expected.slowest(50)}
    assert set(at.dataframe[0].value["trace_id"]) == slowest
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download CSV (50 requests)", "Download Perfetto JSON (50 requests)"]
    at.radio(key="export_scope").set_value("all").run()
    n = len(expected.requests)
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == [f"Download CSV ({n:,} requests)", f"Download Perfetto JSON ({n:,} requests)"]


def test_export_csv_rows_of_the_chosen_requests(expected):
    table = pd.DataFrame(expected.table())
    few = [r.trace_id for r in expected.requests[40:2:-9]]  # not in the table's order
    rows = export.rows_of(table, few)
    assert rows["trace_id"].tolist() == [t for t in table["trace_id"] if t in set(few)]
    frame = pd.read_csv(io.BytesIO(export.table_csv(rows)))
    assert frame["trace_id"].tolist() == rows["trace_id"].tolist()
    assert list(frame.columns) == list(table.columns)
    assert export.rows_of(table, None) is table and export.rows_of(table, []).empty


def test_export_perfetto_through_the_index_keeps_no_span_views(traces, expected):
    """The console's Perfetto file from the analysis index equals the analysis's for the
    same requests (all of them, a few, none), and the span views it made, a batch at a
    time as the file is written, are kept by no one (thousands of them are gigabytes)."""
    snap = data.Feed(data.Source.traces([str(traces[0])])).snapshot()
    assert snap.expand is not None  # the index: requests come without span views
    few = [r.trace_id for r in expected.requests[3:40:7]]
    for ids in (None, few, []):
        run = snap.perfetto_run(ids)
        got = json.loads(export.perfetto_json(run))
        assert got == json.loads(json.dumps(to_perfetto(expected, ids)))
        assert len(run.requests) == (len(expected.requests) if ids is None else len(ids))
        assert run.requests.loaded == 0
    assert not snap._full


def test_export_window_and_command(traces, expected):
    table = pd.DataFrame(expected.table())
    s = table["start_unix_ms"].to_numpy() / 1000.0
    width, starts = export.window_buckets(table)
    assert width == 60 and starts == sorted({int(x // 60) * 60 for x in s})
    inside = (s >= starts[0]) & (s < starts[0] + 60)
    assert export.window_ids(table, starts[0], starts[0] + 60) == table["trace_id"][inside].tolist()
    assert export.window_ids(table, starts[-1] + 60, starts[-1] + 120) == []
    # runs days apart: only the minutes with requests, then wider buckets past the cap
    apart = pd.DataFrame(
        {"start_unix_ms": [0.0, 61e3, 86_400e3 * 400, np.nan], "trace_id": list("abcd")}
    )
    assert export.window_buckets(apart) == (60, [0, 60, 86_400 * 400])
    assert export.window_ids(apart, 60, 86_400 * 400 + 60) == ["b", "c"]
    many = pd.DataFrame({"start_unix_ms": np.arange(3_000) * 60e3, "trace_id": "x"})
    assert export.window_buckets(many)[0] == 300
    assert export.bucket_label(86_400 * 400 + 3_720, 60) == "1971-02-05 01:02"
    assert export.bucket_label(86_400 * 400, 86_400) == "1971-02-05"
    # in the browser's time zone: Los Angeles 8 hours behind UTC then, Kolkata 5:30 ahead
    la, kolkata = zones.zone("America/Los_Angeles"), zones.zone("Asia/Kolkata")
    assert export.bucket_label(86_400 * 400 + 3_720, 60, la) == "1971-02-04 17:02"
    assert export.bucket_label(86_400 * 400 + 3_720, 60, kolkata) == "1971-02-05 06:32"
    assert export.bucket_label(86_400 * 400, 86_400, la) == "1971-02-04 16:00"  # a UTC day
    assert export.bucket_label(86_400 * 400, 86_400, zones.zone("Etc/UTC")) == "1971-02-05"
    two = data.Source.traces(["/x/a b", "/x/c"])
    assert export.perfetto_command(two) == (
        "tracedpush report --traces '/x/a b' --traces /x/c --format perfetto "
        f"--out {export.PERFETTO_FILE}"
    )
    jaeger = data.Source("jaeger", "http://j:16686", "proxy", "2h")
    assert export.perfetto_command(jaeger) == (
        "tracedpush report --jaeger http://j:16686 --lookback 2h --service proxy "
        f"--format perfetto --out {export.PERFETTO_FILE}"
    )
    assert export.perfetto_command(data.Source("none")) is None
    assert export.perfetto_command(two, (86_400, 86_460)).endswith(
        "--since 1970-01-02T00:00:00Z --until 1970-01-02T00:01:00Z --format perfetto "
        f"--out {export.PERFETTO_FILE}"
    )


def test_export_page_offers_a_time_window_and_caps_one_file(app, traces, expected, monkeypatch):
    """A time window exports the requests that arrived in it (by default the run's last
    minute); more than `PERFETTO_MAX` in one file are refused with the CLI command that
    streams them, never built in the server's memory."""
    at = app(traces=traces[0], page="views/export.py")
    at.radio(key="export_scope").set_value("a time window").run()
    no_exception(at)
    table = pd.DataFrame(expected.table())
    width, starts = export.window_buckets(table)
    if len(starts) == 1:  # the run within one minute, by the clock: no slider to slide
        assert not at.get("select_slider")
    else:
        assert at.select_slider(key="export_window").value == (starts[-1], starts[-1])
    for first, last in ((starts[-1], starts[-1]), (starts[0], starts[-1])):
        if len(starts) > 1:
            at.select_slider(key="export_window").set_value((first, last)).run()
        n = len(export.window_ids(table, first, last + width))
        assert any(c.value.startswith(f"{n:,} requests arrived from ") for c in at.caption)
        csv, button = (b.proto for b in at.get("download_button"))
        assert button.label == f"Download Perfetto JSON ({n:,} requests)"
        assert csv.label == f"Download CSV ({n:,} requests)"
        assert not button.disabled
    assert n == len(expected.requests)  # the whole run's minutes

    monkeypatch.setattr(export, "PERFETTO_MAX", 10)
    at.radio(key="export_scope").set_value("all").run()
    no_exception(at)
    csv, button = (b.proto for b in at.get("download_button"))
    assert button.disabled and not csv.disabled  # a CSV of every request is cheap
    assert any(
        f"tracedpush report --traces {traces[0]}" in w.value and "at most 10 " in w.value
        for w in at.warning
    )
    at.radio(key="export_scope").set_value("slowest 50").run()
    assert at.get("download_button")[1].proto.disabled  # 50 > 10 too
    at.radio(key="export_scope").set_value("a time window").run()
    if len(starts) > 1:
        at.select_slider(key="export_window").set_value((starts[0], starts[-1])).run()
    assert at.get("download_button")[1].proto.disabled  # the whole run's minutes
    since = export._iso(starts[0])
    assert any(f"--since {since} --until " in w.value for w in at.warning)


def test_export_window_of_a_run_within_one_minute(app, tmp_path):
    """A run within one minute gives no slider (one position to slide to) and takes it all."""
    start = (time.time() // 60 - 5) * 60 + 5  # 5 s into a minute, 5 minutes ago
    generate(6, seed=3, start_unix_s=start).write(tmp_path)
    at = app(traces=tmp_path, page="views/export.py")
    at.radio(key="export_scope").set_value("a time window").run()
    no_exception(at)
    assert not at.get("select_slider")
    assert any(c.value.startswith("6 requests arrived from ") for c in at.caption)
    assert at.get("download_button")[1].proto.label == "Download Perfetto JSON (6 requests)"


def test_export_without_selection_says_so(app, traces):
    at = app(traces=traces[0], page="views/export.py")
    no_exception(at)
    assert at.radio(key="export_scope").value == "all"  # nothing selected: all by default
    at.radio(key="export_scope").set_value("selected request").run()
    assert any("No request selected" in i.value for i in at.info)
    assert [b.proto.disabled for b in at.get("download_button")] == [True, True]
