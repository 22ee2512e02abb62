"""The Sweep page: figures built from `vllm bench serve` result files (pure builders),
`--bench` / ``TRACEDPUSH_BENCH`` and the traces beside a sweep, and the page in an
AppTest on a synthetic sweep (2 QPS x 2 input lengths x push and pull, traces whose
request ids are the result files' ``prefix + i``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import SWEEP_LENS, SWEEP_PER_CELL, SWEEP_QPS, sweep_prefix

from tracedpush.analysis import TraceStore, analyze
from tracedpush.analysis import bench as ab
from tracedpush.analysis.bench_results import load_results
from tracedpush.analysis.compare import summary
from tracedpush.cli import main as cli_main
from tracedpush.console import bench, sweep_charts
from tracedpush.console.source import ENV_BENCH, ENV_JAEGER, ENV_TRACES, bench_from_args, from_args
from tracedpush.testing.console import figure, figures, messages, no_exception, traces_of

SWEEP_PAGE = "views/sweep.py"


@pytest.fixture(scope="module")
def loaded(sweep) -> bench.BenchLoad:
    return bench.load(str(sweep[0]))


# ------------------------------------------------------------------ pure builders


def test_one_row_per_cell_and_mode_with_the_clients_percentiles(sweep, loaded):
    cells = loaded.cells
    assert len(cells) == 2 * len(SWEEP_LENS) * len(SWEEP_QPS)
    assert not loaded.skipped and not loaded.notes
    results, _ = load_results(sweep[0])
    for row in cells.itertuples(index=False):
        (res,) = [r for r in results if r.mode == row.mode and (r.input_len, r.qps) == (
            row.input_len, row.qps)]  # fmt: skip
        ttft = summary(r.ttft_s * 1000 for r in res.rows if r.ok)
        assert row.ttft_p50 == pytest.approx(ttft["p50"])
        assert row.ttft_p99 == pytest.approx(ttft["p99"])
        assert row.ttft_p50 == pytest.approx(res.data["median_ttft_ms"])  # vLLM's own median
        assert row.tpot_mean == pytest.approx(res.data["mean_tpot_ms"])
        assert row.ok == row.requests == SWEEP_PER_CELL


@pytest.mark.parametrize("stat", ["p50", "mean", "p90", "p99"])
def test_ttft_and_tpot_against_qps_one_line_per_mode_and_length(loaded, stat):
    cells = loaded.cells
    for metric in ("ttft", "tpot"):
        fig = sweep_charts.sweep_figure(cells, metric, stat).to_plotly_json()
        assert fig["layout"]["meta"]["kind"] == f"sweep_{metric}"
        lines = [t for t in fig["data"] if t["meta"]["kind"] == "sweep"]
        assert {(t["meta"]["mode"], t["meta"]["input_len"]) for t in lines} == {
            (m, n) for m in ("push", "pull") for n in SWEEP_LENS
        }
        assert len(lines) == 2 * len(SWEEP_LENS)
        colour = {}
        for t in lines:
            m, n = t["meta"]["mode"], t["meta"]["input_len"]
            assert t["line"]["dash"] == {"push": "solid", "pull": "dash"}[m]
            assert list(t["x"]) == sorted(SWEEP_QPS)  # QPS ascending
            want = cells[(cells["mode"] == m) & (cells["input_len"] == n)].sort_values("qps")
            assert list(t["y"]) == pytest.approx(want[f"{metric}_{stat}"].tolist())
            assert colour.setdefault(n, t["line"]["color"]) == t["line"]["color"]
            assert t["name"] == f"{n:,} in · {m}"
        assert len(set(colour.values())) == len(SWEEP_LENS)  # a colour per input length


def test_x_is_sorted_whatever_order_the_files_came_in(loaded):
    shuffled = loaded.cells.sample(frac=1.0, random_state=3)
    fig = sweep_charts.sweep_figure(shuffled, "ttft").to_plotly_json()
    assert all(list(t["x"]) == sorted(t["x"]) for t in fig["data"])
    assert list(fig["layout"]["xaxis"]["tickvals"]) == sorted(SWEEP_QPS)


def test_no_cells_is_an_empty_figure():
    fig = sweep_charts.sweep_figure(bench.cell_frame([]), "ttft")
    assert not fig.data and "no sweep cells" in fig.layout.annotations[0].text


def test_phase_delta_bars_add_up_to_the_cells_mean_difference(sweep, loaded):
    run = analyze(TraceStore.from_path(sweep[0] / "traces"))
    doc = ab.join(loaded.results, run).to_json()
    n, q = SWEEP_LENS[-1], SWEEP_QPS[-1]
    cell = bench.cell_of(doc, n, q)
    assert cell is not None and cell["input_len"] == n
    account = cell["ttft_account"]
    fig = sweep_charts.phase_delta_figure(account).to_plotly_json()
    (bars,) = fig["data"]
    assert sum(bars["x"]) == pytest.approx(account["ttft_mean_delta_ms"], abs=0.01 * len(bars["x"]))
    assert list(bars["x"]) == sorted(bars["x"], key=abs)  # largest at the top
    assert "needs joined" in sweep_charts.phase_delta_figure(None).layout.annotations[0].text


def test_malformed_and_unplaced_files_are_listed_and_the_rest_kept(sweep, tmp_path):
    shutil.copytree(sweep[0], tmp_path / "s", ignore=shutil.ignore_patterns("traces"))
    (tmp_path / "s" / "push-qps9-in9.json").write_text("{not json")
    (tmp_path / "s" / "report.json").write_text(json.dumps({"ttfts": [0.1]}))
    vllm_own = json.loads((tmp_path / "s" / "pull-qps1-in256.json").read_text())
    del vllm_own["tracedpush"]
    vllm_own["request_rate"] = "inf"
    (tmp_path / "s" / "vllm-at-once.json").write_text(json.dumps(vllm_own))
    got = bench.load(str(tmp_path / "s"))
    assert len(got.skipped) == 2
    assert any("push-qps9-in9.json" in s for s in got.skipped)
    assert got.notes == [f"{tmp_path / 's' / 'vllm-at-once.json'}: no mode, finite request rate"]
    assert len(got.cells) == 2 * len(SWEEP_LENS) * len(SWEEP_QPS)


def test_a_cell_measured_twice_is_one_row_over_both_files(sweep, tmp_path):
    shutil.copytree(sweep[0], tmp_path / "s", ignore=shutil.ignore_patterns("traces"))
    src = tmp_path / "s" / "push-qps1-in256.json"
    (tmp_path / "s" / "again").mkdir()
    shutil.copy(src, tmp_path / "s" / "again" / src.name)
    cells = bench.load(str(tmp_path / "s")).cells
    row = cells[(cells["mode"] == "push") & (cells["input_len"] == 256) & (cells["qps"] == 1.0)]
    assert len(row) == 1 and int(row["requests"].iloc[0]) == 2 * SWEEP_PER_CELL


def test_the_stamp_changes_when_a_cell_is_written(sweep, tmp_path):
    shutil.copytree(sweep[0], tmp_path / "s", ignore=shutil.ignore_patterns("traces"))
    before = bench.stamp(str(tmp_path / "s"))
    assert len(before) == 2 * len(SWEEP_LENS) * len(SWEEP_QPS)  # not sweep.json, not traces
    shutil.copy(tmp_path / "s" / "push-qps1-in256.json", tmp_path / "s" / "push-qps8-in256.json")
    assert len(bench.stamp(str(tmp_path / "s"))) == len(before) + 1
    assert bench.stamp(str(tmp_path / "missing")) == ()


# ------------------------------------------------------------------ where results come from


def test_bench_from_args_and_environment(sweep, tmp_path):
    root = sweep[0]
    assert bench_from_args(["--bench", str(root)], env={}) == str(root)
    assert bench_from_args([], env={ENV_BENCH: str(root)}) == str(root)
    assert bench_from_args([], env={}) is None
    # the sweep's own traces are the source when no other is given ...
    assert from_args(["--bench", str(root)], env={}).location == str(root / "traces")
    assert from_args([], env={ENV_BENCH: str(root)}).location == str(root / "traces")
    one = root / sweep_charts_file()
    assert from_args(["--bench", str(one)], env={}).location == str(root / "traces")
    # ... but not over one given, and not when there is none
    assert from_args(["--bench", str(root), "--traces", str(tmp_path)], env={}).location == str(
        tmp_path
    )
    assert from_args(["--bench", str(tmp_path)], env={}).kind == "none"


def sweep_charts_file() -> str:
    return f"push-qps{SWEEP_QPS[0]:g}-in{SWEEP_LENS[0]}.json"


def test_cli_passes_bench_to_the_app(monkeypatch, sweep, tmp_path, captured_streamlit):
    seen = captured_streamlit
    assert cli_main(["console", "--bench", str(sweep[0])]) == 0
    args = seen["cmd"][seen["cmd"].index("--") + 1 :]
    assert args == ["--bench", str(sweep[0])]
    assert from_args(args, env={}).location == str(sweep[0] / "traces")
    assert cli_main(["console", "--traces", str(tmp_path), "--bench", str(sweep[0])]) == 0
    args = seen["cmd"][seen["cmd"].index("--") + 1 :]
    assert args == ["--traces", str(tmp_path), "--bench", str(sweep[0])]
    assert cli_main(["console", "--jaeger", "http://j:16686", "--bench", "r"]) == 0
    args = seen["cmd"][seen["cmd"].index("--") + 1 :]
    assert args == [
        "--jaeger",
        "http://j:16686",
        "--lookback",
        "1h",
        "--bench",
        str(Path("r").resolve()),
    ]


# ------------------------------------------------------------------ the page (AppTest)


@pytest.fixture
def sweep_app(app, monkeypatch):
    def make(bench_path: str | Path | None, **kw):
        monkeypatch.delenv(ENV_BENCH, raising=False)
        if bench_path is not None:
            monkeypatch.setenv(ENV_BENCH, str(bench_path))
        return app(page=SWEEP_PAGE, **kw)

    return make


def test_sweep_page_draws_both_figures_and_explains_the_picked_cell(sweep_app, sweep, loaded):
    at = sweep_app(sweep[0])
    no_exception(at)
    assert [t.value for t in at.title] == ["Sweep"]
    ttft, tpot = figure(at, "sweep_ttft"), figure(at, "sweep_tpot")
    assert len(traces_of(ttft, kind="sweep")) == len(traces_of(tpot, kind="sweep")) == 4
    delta = figure(at, "sweep_phase_delta")
    # the default cell is the longest prompts at the highest rate; the text is the join's
    run = analyze(TraceStore.from_path(sweep[0] / "traces"))
    cell = bench.cell_of(ab.join(loaded.results, run).to_json(), SWEEP_LENS[-1], SWEEP_QPS[-1])
    assert delta["layout"]["meta"]["total_ms"] == cell["ttft_account"]["ttft_mean_delta_ms"]
    assert any(md.value == cell["explanation"] for md in at.markdown)
    phases = [d.value for d in at.dataframe if "phase" in d.value.columns]
    assert phases and set(phases[0]["phase"]) == {
        p["phase"] for p in cell["ttft_account"]["phases"]
    }
    links = {p.proto.label.split(":")[0]: p.proto.query_string for p in at.get("page_link")}
    labels = {p.proto.label for p in at.get("page_link")}
    assert labels == {f"{m}: {cell['modes'][m]['typical']['request_id']}" for m in ("push", "pull")}
    assert links == {
        m: f"request={cell['modes'][m]['typical']['trace_id']}" for m in ("push", "pull")
    }
    assert all(p.proto.page == "timeline" for p in at.get("page_link"))
    assert cell["modes"]["push"]["typical"]["request_id"].startswith(
        sweep_prefix("push", SWEEP_QPS[-1], SWEEP_LENS[-1])
    )


def test_picking_a_cell_and_a_statistic(sweep_app, sweep):
    at = sweep_app(sweep[0])
    at.selectbox(key="sweep_input_len").set_value(SWEEP_LENS[0]).run()
    at.selectbox(key="sweep_qps").set_value(SWEEP_QPS[0]).run()
    no_exception(at)
    assert any(f"{SWEEP_LENS[0]:,}-token prompts at {SWEEP_QPS[0]:g} QPS" in m.value
               for m in at.markdown)  # fmt: skip
    assert f"pull-qps{SWEEP_QPS[0]:g}-in{SWEEP_LENS[0]}.json" in messages(at)
    at.button_group(key="sweep_stat").set_value("p99").run()
    no_exception(at)
    meta = [f["layout"]["meta"] for f in figures(at) if f["layout"].get("meta", {}).get("stat")]
    assert {m["stat"] for m in meta} == {"p99"}


def test_without_results_the_page_says_how_to_get_them(sweep_app, traces):
    at = sweep_app(None, traces=traces[0])
    no_exception(at)
    text = messages(at)
    assert "No benchmark results" in text and "tracedpush bench sweep" in text
    assert "--bench" in text and not figures(at)


def test_a_missing_results_path_is_calm(sweep_app, tmp_path):
    at = sweep_app(tmp_path / "not-yet")
    no_exception(at)
    assert "does not exist (yet)" in messages(at)


def test_malformed_files_are_warned_about_and_the_rest_drawn(sweep_app, sweep, tmp_path):
    shutil.copytree(sweep[0], tmp_path / "s")
    (tmp_path / "s" / "push-qps9-in9.json").write_text("{not json")
    at = sweep_app(tmp_path / "s")
    no_exception(at)
    warned = " ".join(w.value for w in at.warning)
    assert "Skipped 1 file" in warned and "push-qps9-in9.json" in warned
    assert len(traces_of(figure(at, "sweep_ttft"), kind="sweep")) == 4


def test_results_without_traces_still_draw_the_figures(sweep_app, sweep, tmp_path, monkeypatch):
    shutil.copytree(sweep[0], tmp_path / "s", ignore=shutil.ignore_patterns("traces"))
    monkeypatch.delenv(ENV_TRACES, raising=False)
    monkeypatch.delenv(ENV_JAEGER, raising=False)
    at = sweep_app(tmp_path / "s")
    no_exception(at)
    figure(at, "sweep_ttft"), figure(at, "sweep_tpot")
    assert "needs the sweep's traces" in messages(at)
    assert not at.get("page_link")


def test_a_single_result_file(sweep_app, sweep):
    at = sweep_app(sweep[0] / sweep_charts_file())
    no_exception(at)
    (line,) = traces_of(figure(at, "sweep_ttft"), kind="sweep")
    assert line["meta"]["mode"] == "push" and list(line["x"]) == [SWEEP_QPS[0]]
    assert "the comparison needs both" in messages(at)


def test_results_typed_on_the_page_open_with_their_traces(sweep_app, sweep, traces):
    at = sweep_app(None, traces=traces[0])
    at.text_input(key="sweep_path").input(str(sweep[0])).run()
    no_exception(at)
    assert len(traces_of(figure(at, "sweep_ttft"), kind="sweep")) == 4
    figure(at, "sweep_phase_delta")  # explained by the sweep's traces, not the others
    assert at.session_state["source"].location == str(sweep[0] / "traces")
    assert len(at.get("page_link")) == 2
