"""`tracedpush report` outputs, the comparison, Perfetto export and timelines."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracedpush import semconv as sc
from tracedpush.analysis import (
    TraceStore,
    analyze,
    compare,
    perfetto,
    phases,
    run_json,
    to_perfetto,
)
from tracedpush.analysis.compare import explain_delta, percentile
from tracedpush.analysis.report import render
from tracedpush.analysis.report_json import indented, request_json
from tracedpush.analysis.timeline import LoadCounter, bucket_label, load_label
from tracedpush.cli import main as cli_main
from tracedpush.testing import synthetic


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, synthetic.SyntheticRun]:
    d = tmp_path_factory.mktemp("traces")
    gen = synthetic.generate(120, seed=17, clock_offsets_ms={synthetic.DECODE_INSTANCE: 30})
    gen.write(d)
    return d, gen


@pytest.fixture(scope="module")
def run(traces: tuple[Path, Any]) -> Any:
    return analyze(TraceStore.from_path(traces[0]))


def test_json_format(traces: tuple[Path, Any], tmp_path: Path) -> None:
    d, gen = traces
    out = tmp_path / "report.json"
    assert cli_main(["report", "--traces", str(d), "--format", "json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["version"] == 2 and doc["skew_corrected"] is True
    offs = doc["clock_offsets_ms"]
    assert set(offs) == {
        synthetic.PROXY_INSTANCE,
        synthetic.PREFILL_INSTANCE,
        synthetic.DECODE_INSTANCE,
    }
    d_off = offs[synthetic.DECODE_INSTANCE]
    assert abs(d_off["offset_ms"] - 30) <= d_off["bound_ms"]
    assert doc["load_stats"]["malformed"] == 0
    truth = gen.by_trace()
    assert len(doc["requests"]) == 120
    for r in doc["requests"]:
        assert {"trace_id", "mode", "ttft_ms", "critical_path", "hidden"} <= set(r)
        assert r["mode"] == truth[r["trace_id"]].mode
        total = sum(s["duration_ms"] for s in r["critical_path"])
        assert abs(total - r["ttft_ms"]) < 1.0
        starts = [s["start_ms"] for s in r["critical_path"]]
        assert starts == sorted(starts)
        assert set(r["critical_path"][0]) >= {"phase", "service", "start_ms", "duration_ms"}
        assert "spans" not in r
        t = truth[r["trace_id"]]
        eng = r["engine_phases_ms"]
        assert set(eng) == {"prefill", "decode"}
        assert eng["prefill"]["queue wait"] == pytest.approx(
            t.expected_engine_ms["prefill"]["queue wait"], abs=1e-3
        )
        transfer = ("prefill", "WRITE") if r["mode"] == "push" else ("decode", "READ")
        assert eng[transfer[0]][transfer[1]] == pytest.approx(
            t.expected_engine_ms[transfer[0]][transfer[1]], abs=1e-4
        )
        assert r["prefill_steps"] == t.prefill_steps
    g = doc["comparison"]["groups"][0]
    assert (g["bucket"], g["load"]) == ("all", "all")
    assert set(g["ttft_ms"]["push"]) >= {"p50", "p90", "p99"}


def test_json_with_spans(traces: tuple[Path, Any], capsys: pytest.CaptureFixture[str]) -> None:
    d, _ = traces
    assert cli_main(["report", "--traces", str(d), "--format", "json", "--spans"]) == 0
    doc = json.loads(capsys.readouterr().out)
    spans = doc["requests"][0]["spans"]
    assert {s["name"] for s in spans} >= {sc.SPAN_REQUEST, sc.SPAN_PREFILL, sc.SPAN_DECODE}
    assert all("lane" in s and "on_critical_path" in s for s in spans)


def test_table_format(traces: tuple[Path, Any], capsys: pytest.CaptureFixture[str]) -> None:
    d, _ = traces
    assert cli_main(["report", "--traces", str(d), "--slowest", "3"]) == 0
    text = capsys.readouterr().out
    for heading in (
        "Clock offsets",
        "push vs pull",
        "Where the TTFT difference goes",
        "Slowest 3 requests",
    ):
        assert heading in text
    assert "skipped malformed: 0" in text
    assert synthetic.DECODE_INSTANCE in text


def test_no_skew_correction_flag(
    traces: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    d, _ = traces
    assert cli_main(["report", "--traces", str(d), "--format", "json", "--no-skew-correction"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["skew_corrected"] is False
    assert (
        cli_main(["report", "--traces", str(d), "--format", "json", "--skew-policy", "zero"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["skew_policy"] == "zero"
    assert doc["clock_offsets_ms"][synthetic.PREFILL_INSTANCE]["offset_ms"] == 0.0


def test_missing_or_empty_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["report", "--traces", str(tmp_path / "absent")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli_main(["report", "--traces", str(tmp_path)]) == 1
    assert "no requests found" in capsys.readouterr().err


def test_custom_buckets(traces: tuple[Path, Any], capsys: pytest.CaptureFixture[str]) -> None:
    d, _ = traces
    args = [
        "report",
        "--traces",
        str(d),
        "--format",
        "json",
        "--buckets",
        "1000",
        "--load-buckets",
        "4",
    ]
    assert cli_main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["bucket"] for r in doc["requests"]} == {"<=1000", ">1000"}
    assert {r["load_bucket"] for r in doc["requests"]} <= {"1-4", ">4"}


# ------------------------------------------------------------------ perfetto


def test_perfetto_tracks_flows_and_nesting(traces: tuple[Path, Any], tmp_path: Path) -> None:
    d, _ = traces
    out = tmp_path / "p.json"
    assert cli_main(["report", "--traces", str(d), "--format", "perfetto", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    procs = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    # one track per instance (plus the critical-path track)
    assert sorted(procs.values()) == sorted(
        [
            "critical path",
            f"{sc.SERVICE_PROXY} {synthetic.PROXY_INSTANCE}",
            f"{sc.SERVICE_PREFILL} {synthetic.PREFILL_INSTANCE}",
            f"{sc.SERVICE_DECODE} {synthetic.DECODE_INSTANCE}",
        ]
    )
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and all(e["dur"] > 0 for e in slices)
    # slices on one (pid, tid) never partially overlap (Perfetto needs them nested)
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in slices:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for iv in by_track.values():
        iv.sort()
        for (_, a1), (b0, b1) in itertools.pairwise(iv):
            assert b0 >= a1 or b1 <= a1
    # flow arrows pair up, and P -> D handoffs are drawn
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and starts
    names = {e["name"] for e in starts.values()}
    assert f"{sc.SPAN_KV_WRITE}->{sc.SPAN_KV_NOTIFY}" in names
    assert f"{sc.SPAN_KV_RELAY}->{sc.SPAN_DECODE}" in names
    pid_of = {v: k for k, v in procs.items()}
    write_flows = [fid for fid, e in starts.items() if e["name"].startswith(sc.SPAN_KV_WRITE)]
    for fid in write_flows:
        assert starts[fid]["pid"] == pid_of[f"{sc.SERVICE_PREFILL} {synthetic.PREFILL_INSTANCE}"]
        assert ends[fid]["pid"] == pid_of[f"{sc.SERVICE_DECODE} {synthetic.DECODE_INSTANCE}"]


def test_perfetto_progress_and_a_document_too_big_for_the_ui(
    traces: tuple[Path, Any],
    run: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A whole run's export takes minutes at 200,000 requests (2.1 GB): it says how far
    it is (every `PROGRESS_EVERY` requests and the last), and a document bigger than
    ui.perfetto.dev can hold (`UI_BYTES`) gets a note naming what opens it; a small one
    none."""
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(perfetto, "PROGRESS_EVERY", 7)
    total = len(run.requests)
    perfetto.write_perfetto(run, io.StringIO(), progress=lambda *a: seen.append(a))
    assert seen == [*((n, total) for n in range(7, total, 7)), (total, total)]

    d, _ = traces
    out = tmp_path / "p.json"
    argv = ["report", "--traces", str(d), "--format", "perfetto", "--out", str(out)]
    assert cli_main(argv) == 0
    assert "ui.perfetto.dev may not open it" not in capsys.readouterr().err
    monkeypatch.setattr(perfetto, "UI_BYTES", out.stat().st_size // 2)
    assert cli_main(argv) == 0
    err = capsys.readouterr().err
    assert f"{out} is " in err and "ui.perfetto.dev may not open it" in err, err
    assert f"trace_processor --httpd {out}" in err and "--since/--until" in err


def test_perfetto_subset_uses_corrected_times(run: Any) -> None:
    r = run.requests[0]
    doc = to_perfetto(run, [r.trace_id])
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "critical"]
    assert len(slices) == len(r.spans)
    decode = next(e for e in slices if e["name"] == sc.SPAN_DECODE)
    view = next(v for v in r.spans if v.name == sc.SPAN_DECODE)
    assert decode["ts"] == pytest.approx(view.start_ms * 1000, abs=0.002)
    assert doc["otherData"]["origin_unix_us"] == pytest.approx(r.start_unix_ms * 1000)
    crit = [e for e in doc["traceEvents"] if e.get("cat") == "critical"]
    assert [e["name"] for e in crit] == [s.phase for s in r.critical_path]


# ------------------------------------------------------------------ comparison


def test_phase_account_adds_up_to_the_mean_ttft_difference(run: Any) -> None:
    cmp = compare(run)
    assert cmp.a == "push" and cmp.b == "pull"
    for g in cmp.groups:
        if g.ttft_mean_delta_ms is None:
            continue
        assert sum(d.delta_ms for d in g.delta) == pytest.approx(g.ttft_mean_delta_ms, abs=1e-6)
        for mode in ("push", "pull"):
            means = sum(s["mean"] for s in g.phases[mode].values())
            assert means == pytest.approx(g.ttft[mode]["mean"], abs=1e-6)
    overall = cmp.overall
    assert overall is not None and overall.n == {"push": 60, "pull": 60}
    assert {g.bucket for g in cmp.groups} >= {"all", "<=256", "<=1024", "<=4096", ">4096"}
    pull_only = {d.phase for d in overall.delta if d.a_ms == 0 and d.b_ms > 0}
    assert {phases.RELAY, phases.READ} <= pull_only


def test_ttft_difference_per_load_bucket_adds_up(run: Any) -> None:
    """For every load bucket present in both modes: push - pull, phase by phase, sums to
    the mean TTFT difference, with unattributed listed and p50s beside the means."""
    cmp = compare(run)
    by_load = cmp.by_load()
    assert len(by_load) >= 3
    assert [g.load for g in by_load] == [ld for ld in cmp.loads if g_has_both(cmp, ld)]
    for g in [cmp.overall, *by_load]:
        acc = g.account
        assert acc is not None
        want = g.ttft["push"]["mean"] - g.ttft["pull"]["mean"]
        assert acc.ttft_mean_delta_ms == pytest.approx(want, abs=1e-9)
        assert sum(r.mean_delta_ms for r in acc.rows) == pytest.approx(want, abs=1e-6)
        assert acc.row(phases.UNATTRIBUTED) is not None
        p50 = g.ttft["push"]["p50"] - g.ttft["pull"]["p50"]
        assert acc.ttft_p50_delta_ms == pytest.approx(p50)
        assert sum(r.p50_delta_ms for r in acc.rows) + acc.p50_remainder_ms == pytest.approx(p50)
        # the existing b - a account is the same numbers, negated
        assert g.ttft_mean_delta_ms == pytest.approx(-want)
        names = [r.phase for r in acc.rows]
        assert names == sorted(names, key=phases.PHASES.index)
        text = explain_delta(g)
        top = max(acc.rows, key=lambda r: abs(r.mean_delta_ms))
        verb = "slower" if want > 0 else "faster"
        assert text.startswith(f"push is {abs(want):.1f} ms {verb} than pull")
        assert f"{top.phase} {top.mean_delta_ms:+.1f} ms" in text
        if g.load != "all":
            assert f"at {g.load} in flight" in text
    doc = run_json(run)
    groups = {(g["bucket"], g["load"]): g for g in doc["comparison"]["groups"]}
    for g in by_load:
        acc_json = groups[("all", g.load)]["ttft_account"]
        assert acc_json["direction"] == "a - b"
        total = sum(p["mean_delta_ms"] for p in acc_json["phases"])
        assert total == pytest.approx(acc_json["ttft_mean_delta_ms"], abs=1e-3)


def g_has_both(cmp: Any, load: str) -> bool:
    g = cmp.group("all", load)
    return g is not None and all(g.n.get(m) for m in ("push", "pull"))


def test_ttft_difference_is_told_per_load_in_the_text_report(run: Any) -> None:
    text = render(run)
    cmp = compare(run)
    for g in cmp.by_load():
        assert f"Where the TTFT difference goes (at {g.load} in flight; push - pull" in text
        assert explain_delta(g) in text
    assert "Where the TTFT difference goes (over all requests" in text
    assert text.count("unattributed") >= 1 + len(cmp.by_load())
    assert explain_delta(None) == "No comparison: needs both push and pull requests."


def test_percentiles_against_known_values(run: Any) -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0], 99) == 10.0
    assert percentile([], 50) is None
    vals = list(range(101))
    assert percentile([float(v) for v in vals], 90) == 90.0
    cmp = compare(run)
    push = sorted(r.ttft_ms for r in run.by_mode("push"))
    assert cmp.overall.ttft["push"]["p50"] == pytest.approx(percentile(push, 50))


def test_table_rows_are_flat(run: Any) -> None:
    rows = run.table()
    assert len(rows) == len(run.requests)
    row = rows[0]
    for key in (
        "trace_id",
        "request_id",
        "mode",
        "prompt_tokens",
        "output_tokens",
        "ttft_ms",
        "tpot_ms",
        "start_unix_ms",
        "load",
        "bucket",
    ):
        assert key in row
    crit = {k: v for k, v in row.items() if k.startswith("critical_ms.")}
    assert sum(crit.values()) == pytest.approx(row["ttft_ms"], abs=1e-6)
    assert run.get(row["request_id"]) is run.get(row["trace_id"])


# ------------------------------------------------------------------ timelines


def test_lanes_separate_threads_and_processes(run: Any) -> None:
    r = next(r for r in run.by_mode("push") if r.rendezvous_first == "registration")
    lanes = {v.name: v.lane for v in r.spans}
    assert lanes[sc.SPAN_PREFILL] == f"{sc.SERVICE_PREFILL}/{synthetic.PREFILL_INSTANCE}/scheduler"
    assert (
        lanes[sc.SPAN_KV_WRITE] == f"{sc.SERVICE_PREFILL}/{synthetic.PREFILL_INSTANCE}/push_writer"
    )
    # registration (D) overlaps prefill (P) on a different lane
    reg = next(v for v in r.spans if v.name == sc.SPAN_KV_REGISTER)
    pre = next(v for v in r.spans if v.name == sc.SPAN_PREFILL)
    assert reg.lane != pre.lane and pre.start_ms < reg.start_ms < pre.end_ms
    assert r.lanes[0].startswith(sc.SERVICE_PROXY)
    assert set(r.lanes) == {v.lane for v in r.spans}


def test_load_and_buckets() -> None:
    lc = LoadCounter([(0, 10), (5, 15), (12, 20)])
    assert [lc.at(t) for t in (0, 5, 10, 12, 15, 20)] == [1, 2, 1, 2, 1, 0]
    assert bucket_label(256) == "<=256" and bucket_label(257) == "<=1024"
    assert bucket_label(10_000) == ">4096" and bucket_label(None) == "unknown"
    assert [load_label(n) for n in (1, 2, 3, 4, 5, 33)] == ["1", "2", "3-4", "3-4", "5-8", ">32"]


def test_requests_group_by_load(run: Any) -> None:
    assert len({r.load for r in run.requests}) > 3  # the generator's waves vary the load
    for r in run.requests:
        assert r.load >= 1 and r.load_bucket == load_label(r.load)


def test_several_traces_flags_are_one_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Engines wrote to their traces_dir, the proxy to its own: give both."""
    gen = synthetic.generate(12, seed=3)
    engines, proxy = tmp_path / "engines", tmp_path / "proxy"
    gen.write(engines, proxy)
    argv = ["report", "--format", "json", "--traces", str(engines)]
    assert cli_main(argv) == 0
    alone = json.loads(capsys.readouterr().out)["requests"]
    assert alone and not any(r["complete"] for r in alone)
    assert cli_main([*argv, "--traces", str(proxy)]) == 0
    both = json.loads(capsys.readouterr().out)["requests"]
    assert len(both) == 12 and all(r["complete"] for r in both)
    assert cli_main([*argv, "--traces", str(tmp_path / "absent")]) == 2
    assert f"{tmp_path / 'absent'}: no such file or directory" in capsys.readouterr().err


def test_a_report_that_fails_midway_leaves_the_earlier_one(
    traces: tuple[Path, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--out is written beside it and then renamed: a report that fails midway (a full
    disk; here the JSON writer raising after part of it) says why, exits 1, and leaves
    the earlier report at --out whole and no temporary file. /dev/null stays a device."""
    import os
    import stat

    from tracedpush.analysis import command

    d, _ = traces
    out = tmp_path / "report.json"
    argv = ["report", "--traces", str(d), "--format", "json", "--out", str(out)]
    assert cli_main(argv) == 0
    before = out.read_text()
    assert json.loads(before)["requests"]

    def torn(_run: Any, fh: Any, **_kw: Any) -> None:
        fh.write('{\n "version": 2,')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(command, "write_json", torn)
    capsys.readouterr()
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert f"could not write {out}" in err and "No space left on device" in err
    assert out.read_text() == before and sorted(tmp_path.iterdir()) == [out]
    monkeypatch.undo()
    assert cli_main([*argv[:-1], os.devnull]) == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_since_until_choose_requests_by_arrival(
    traces: tuple[Path, Any], run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--since` / `--until` keep the requests the proxy received in [since, until), the
    same through the analysis index and without it, in every format; a Perfetto file of
    a window equals `to_perfetto` of those requests."""
    d = tmp_path / "traces"
    shutil.copytree(traces[0], d)  # an index of its own beside them
    starts = sorted(r.start_unix_ms for r in run.requests)
    # 50 requests: the 21st up to the 71st (bounds between two: ISO keeps microseconds)
    since, until = (starts[19] + starts[20]) / 2, (starts[69] + starts[70]) / 2
    want = sorted(r.trace_id for r in run.requests if since <= r.start_unix_ms < until)
    assert len(want) == 50
    iso = datetime.fromtimestamp(since / 1000, tz=UTC).isoformat()  # with its offset
    window = ["--since", iso, "--until", str(until / 1000)]
    docs = []
    for extra in (["--no-index"], ["--index"]):
        out = tmp_path / f"{extra[0]}.json"
        args = ["report", "--traces", str(d), "--out", str(out), *window, *extra]
        assert cli_main([*args, "--format", "json"]) == 0
        doc = json.loads(out.read_text())
        del doc["load_stats"]
        docs.append(doc)
        assert sorted(r["trace_id"] for r in doc["requests"]) == want
        assert cli_main([*args, "--format", "perfetto"]) == 0
        assert json.loads(out.read_text()) == json.loads(json.dumps(to_perfetto(run, want)))
        assert cli_main(["report", "--traces", str(d), *window, *extra]) == 0
        table = capsys.readouterr().out
        assert "requests: 50 (" in table
        since_s = datetime.fromtimestamp(since / 1000, tz=UTC).isoformat(timespec="seconds")
        until_s = datetime.fromtimestamp(until / 1000, tz=UTC).isoformat(timespec="seconds")
        assert f"{d}, requests received from {since_s} until {until_s}" in table
    assert docs[0] == docs[1]
    whole = json.loads(json.dumps(run_json(run)))
    assert docs[0]["source"].startswith(f"{d}, requests received from ")
    for key in ("clock_offsets_ms", "engine_steps"):
        assert docs[0][key] == whole[key] and whole[key]  # the whole run's
    naive = datetime.fromtimestamp(until / 1000, tz=UTC).replace(tzinfo=None).isoformat()
    assert cli_main(["report", "--traces", str(d), "--format", "json", "--until", naive]) == 0
    got = json.loads(capsys.readouterr().out)["requests"]
    assert len(got) == 70  # a naive time is UTC


def test_since_until_take_how_long_ago(
    traces: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A duration is that long before now: the synthetic run is from 2023."""
    d = str(traces[0])
    for window, n in ((["--since", "5000d"], 120), (["--until", "1h30m"], 120)):
        assert cli_main(["report", "--traces", d, "--format", "json", *window]) == 0
        assert len(json.loads(capsys.readouterr().out)["requests"]) == n
    assert cli_main(["report", "--traces", d, "--since", "2d"]) == 1
    assert "none of the 120 requests is chosen (since " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "is not a time"),
        (["--since", "2026-12-04T03:30", "--until", "2026-12-04T03:30"], "is not before"),
        (["--bench", "x.json", "--since", "1"], "do not apply to --bench"),
    ],
)
def test_since_until_refuse_what_is_not_a_window(
    traces: tuple[Path, Any], args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) if "yesterday" in args else contextlib.nullcontext():
        code = cli_main(["report", "--traces", str(traces[0]), *args])
        assert code == 2
    assert message in capsys.readouterr().err


def test_a_window_with_no_request_says_so(
    traces: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["report", "--traces", str(traces[0]), "--until", "1"]) == 1
    err = capsys.readouterr().err
    assert "none of the 120 requests is chosen (until 1970-01-01T00:00:01+00:00)" in err


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(_JSON)
def test_indented_is_json_dumps_indent_1(doc: Any) -> None:
    """The JSON report's fast indenting writes what ``json.dumps(indent=1)`` writes, for
    any JSON value: escapes, numbers (huge integers, tiny floats), empty containers, and
    NaN or infinities (not JSON: written the slow way, as Python writes them)."""
    assert indented(doc) == json.dumps(doc, indent=1)


def test_indented_on_report_documents(traces: tuple[Path, Any], run: Any) -> None:
    """Every request of a run, with its spans, and the run's document itself."""
    docs = [request_json(r, spans=True) for r in run.requests] + [run_json(run)]
    assert all(indented(d) == json.dumps(d, indent=1) for d in docs)
    assert indented({"ttft_ms": float("nan")}) == '{\n "ttft_ms": NaN\n}'
