"""`report --bench`: benchmark result files joined to their traces (analysis.bench)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze
from tracedpush.analysis.bench import GIVEN, IDS, INFERRED, NONE, infer_prefix, join, render_bench
from tracedpush.analysis.bench_results import (
    CLOCK,
    OURS,
    ClientClock,
    cell_filename,
    load_results,
    parse_result,
    read_result,
)
from tracedpush.analysis.compare import percentile, summary
from tracedpush.analysis.results import RequestAnalysis, RunAnalysis
from tracedpush.cli import main as cli_main
from tracedpush.testing import synthetic

N = 16  # requests per mode and cell
CELLS = ((256, 2.0), (1024, 4.0))  # (input_len, qps)
GAP = 0.1  # the client's TTFT is span / (1 - GAP): 10% above the proxy's, exactly
PREFIX_PUSH = "bench-1a2b3c4d-"  # vLLM-style prefixes (``bench-<8 hex>-``)
PREFIX_PULL = "bench-9f8e7d6c-"


# ------------------------------------------------------------------ building blocks


def rename(gen: synthetic.SyntheticRun, ids: Mapping[str, str]) -> None:
    """Give the generated requests the ids a benchmark client would have sent."""
    for docs in gen.files.values():
        for doc in docs:
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        for attr in span.get("attributes", ()):
                            if attr["key"] == sc.REQUEST_ID:
                                v = attr["value"]["stringValue"]
                                attr["value"]["stringValue"] = ids.get(v, v)


def vllm_result(
    requests: Sequence[RequestAnalysis],
    *,
    gap: float = GAP,
    extra_ms: float = 0.0,
    qps: float = 2.0,
    ours: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What `vllm bench serve --save-result --save-detailed` writes for these requests
    (the client measures TTFT span / (1 - gap) + extra_ms), plus our keys if `ours`."""
    ttfts = [(r.ttft_ms or 0.0) / (1.0 - gap) / 1000.0 + extra_ms / 1000.0 for r in requests]
    tpots = [(r.tpot_ms or 0.0) / 1000.0 for r in requests]
    outs = [r.output_tokens or 1 for r in requests]
    lat = [t + p * (o - 1) for t, p, o in zip(ttfts, tpots, outs, strict=True)]
    data: dict[str, Any] = {
        "date": "20260101-000000",
        "backend": "openai",
        "model_id": "tiny",
        "num_prompts": len(requests),
        "request_rate": qps,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 10.0,
        "completed": len(requests),
        "failed": 0,
        "mean_ttft_ms": sum(ttfts) / max(len(ttfts), 1) * 1000,
        "input_lens": [r.prompt_tokens for r in requests],
        "output_lens": outs,
        "ttfts": ttfts,
        "itls": [[p] * (o - 1) for p, o in zip(tpots, outs, strict=True)],
        "latencies": lat,
        "start_times": [r.start_unix_ms / 1000.0 for r in requests],
        "queue_times": [0.0] * len(requests),
        "generated_texts": ["x"] * len(requests),
        "errors": [""] * len(requests),
    }
    if ours is not None:
        data["request_ids"] = [r.request_id for r in requests]
        data[OURS] = ours
    return data


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def our_id(mode: str, input_len: int, i: int) -> str:
    return f"tp-{mode}-in{input_len}-{i}"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RunAnalysis]:
    """A sweep directory as `tracedpush bench sweep` leaves it: one result file per
    (mode, cell) with ids and our block, traces under ``traces/``."""
    root = tmp_path_factory.mktemp("sweep")
    for k, (length, qps) in enumerate(CELLS):
        gen = synthetic.generate(
            2 * N, seed=40 + k, prompt_tokens=[length], qps=(qps,), start_unix_s=1.76e9 + 3600 * k
        )
        rename(
            gen, {r.request_id: our_id(r.mode, length, i % N) for i, r in enumerate(gen.requests)}
        )
        gen.write(root / "traces" / f"in{length}")
    run = analyze(TraceStore.from_path(root / "traces"), spans=False)
    for length, qps in CELLS:
        for mode in ("push", "pull"):
            reqs = [run.get(our_id(mode, length, i)) for i in range(N)]
            assert all(r is not None for r in reqs)
            block = {"mode": mode, "qps": qps, "input_len": length, "output_len": 64}
            block["traces"] = "traces"
            data = vllm_result(reqs, qps=qps, ours=block)  # type: ignore[arg-type]
            write_json(root / cell_filename(mode, qps, length), data)
    write_json(root / "sweep.json", {"cells": []})  # the manifest is not a result
    return root, run


@pytest.fixture(scope="module")
def vllm_style(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, RunAnalysis]:
    """Two runs of vLLM's own client (prefixes A for push, B for pull, same length and
    size), plus a ready check and a warm-up re-sending push row 0's id; the result file
    of the push run has no ids and no block."""
    root = tmp_path_factory.mktemp("vllm")
    gen = synthetic.generate(2 * N, seed=7, prompt_tokens=[512], qps=(3.0,))
    ids = {
        r.request_id: f"{PREFIX_PUSH if r.mode == 'push' else PREFIX_PULL}{i % N}"
        for i, r in enumerate(gen.requests)
    }
    rename(gen, ids)
    gen.write(root / "traces" / "main")
    warm = synthetic.generate(2, modes=("push",), seed=8, prompt_tokens=[512], start_unix_s=1.7e9)
    rename(warm, {r.request_id: f"{PREFIX_PUSH}0" for r in warm.requests})
    warm.write(root / "traces" / "warmup")
    run = analyze(TraceStore.from_path(root / "traces"), spans=False)
    truth = [r for r in gen.requests if r.mode == "push"]
    reqs = [next(x for x in run.requests if x.trace_id == t.trace_id) for t in truth]
    # the client is 1 ms above the proxy: the right prefix agrees within 1 ms
    data = vllm_result(reqs, gap=0.0, extra_ms=1.0, qps=3.0)
    return write_json(root / "push-run.json", data), root / "traces", run


# ------------------------------------------------------------------ join


def test_sweep_joins_every_row_by_id(sweep: tuple[Path, RunAnalysis]) -> None:
    root, run = sweep
    results, skipped = load_results(root)
    assert len(results) == 4 and skipped == []
    bj = join(results, run)
    assert bj.joined_fraction == 1.0 and bj.joined == bj.rows == 4 * N
    for f in bj.files:
        assert f.prefix_source == IDS and f.mode_source == "file" and f.mode_mismatches == 0
        for row, req in f.pairs():
            assert req.request_id == row.request_id
            assert req.mode == f.mode
    doc = bj.to_json()
    t = doc["totals"]
    assert t["joined_fraction"] == 1.0 and t["unjoined"] == 0 and t["duplicate_ids"] == 0
    assert t["traces"] == len(run.requests) == t["files"] * N
    assert t["traces_unclaimed"] == 0 and t["prefixes"] == []
    assert [(c["input_len"], c["qps"]) for c in doc["cells"]] == list(CELLS)
    json.dumps(doc)  # plain JSON


def test_cell_percentiles_ratios_and_agreement(sweep: tuple[Path, RunAnalysis]) -> None:
    root, run = sweep
    results, _ = load_results(root)
    bj = join(results, run)
    for length, qps in CELLS:
        c = bj.cell(length, qps)
        assert c is not None and list(c.modes) == ["push", "pull"]
        for mode, mc in c.modes.items():
            spans = [run.get(our_id(mode, length, i)) for i in range(N)]
            client = [(r.ttft_ms or 0) / (1 - GAP) for r in spans if r is not None]
            want = summary(client)
            for q in ("p50", "p90", "p99", "mean"):
                assert mc.client_ttft_ms[q] == pytest.approx(want[q])
            assert mc.client_ttft_ms["n"] == N and mc.sent == mc.succeeded == mc.joined == N
            tpots = [r.tpot_ms for r in spans if r is not None and r.tpot_ms is not None]
            assert mc.client_tpot_ms["p50"] == pytest.approx(summary(tpots)["p50"])
            assert mc.span_ttft_ms["p50"] == pytest.approx(
                summary(r.ttft_ms for r in spans if r and r.ttft_ms)["p50"]
            )
            # client = span / 0.9: every gap is exactly +10%, 0.1 x the client's TTFT in ms
            ag = mc.agreement
            assert ag.n == N
            assert ag.median_gap_pct == pytest.approx(100 * GAP)
            assert ag.median_abs_gap_pct == pytest.approx(100 * GAP)
            assert ag.median_abs_gap_ms == pytest.approx(percentile(sorted(client), 50) * GAP)
            row, req, _ = mc.typical  # type: ignore[misc]
            med = want["p50"]
            assert all(abs((row.ttft_s or 0) * 1000 - med) <= abs(x - med) + 1e-9 for x in client)
            assert req.request_id == row.request_id
        assert c.ratios is not None
        for q in ("p50", "p90", "p99"):
            a, b = c.modes["push"].client_ttft_ms[q], c.modes["pull"].client_ttft_ms[q]
            assert c.ratios["ttft"][q] == pytest.approx(a / b)  # type: ignore[operator]
            a, b = c.modes["push"].client_tpot_ms[q], c.modes["pull"].client_tpot_ms[q]
            assert c.ratios["tpot"][q] == pytest.approx(a / b)  # type: ignore[operator]


def test_phase_account_adds_up_to_the_mean_ttft_difference(
    sweep: tuple[Path, RunAnalysis],
) -> None:
    root, run = sweep
    results, _ = load_results(root)
    bj = join(results, run)
    for c in bj.cells:
        acc = c.account
        assert acc is not None
        span = {
            m: [r.ttft_ms for _, r in c.modes[m].pairs if r.ttft_ms is not None]
            for m in ("push", "pull")
        }
        mean_delta = sum(span["push"]) / N - sum(span["pull"]) / N
        assert acc.ttft_mean_delta_ms == pytest.approx(mean_delta)
        assert sum(r.mean_delta_ms for r in acc.rows) == pytest.approx(mean_delta, abs=1e-6)
        # phases are the traces' own: pull's READ and push's WRITE are both there
        assert {"WRITE", "READ"} <= {r.phase for r in acc.rows}
        assert c.client_ttft_mean_delta_ms == pytest.approx(mean_delta / (1 - GAP))
        assert c.explanation.startswith("push is ") and c.where in c.explanation
        assert c.tpot_account is not None and c.tpot_explanation
        doc = c.to_json()
        phases = doc["ttft_account"]["phases"]
        assert sum(p["mean_delta_ms"] for p in phases) == pytest.approx(mean_delta, abs=1e-3)
        assert doc["modes"]["push"]["typical"]["trace_id"]


def test_prefix_inferred_among_two_and_warmup_duplicates(
    vllm_style: tuple[Path, Path, RunAnalysis],
) -> None:
    path, _, run = vllm_style
    res = read_result(path)
    assert not res.has_ids and res.mode is None
    guess = infer_prefix(res, run)
    assert guess.prefix == PREFIX_PUSH and guess.matched == N and guess.note == ""
    assert {p for p, _, _ in guess.candidates} == {PREFIX_PUSH, PREFIX_PULL}
    bj = join([res], run)
    (f,) = bj.files
    assert (f.prefix, f.prefix_source, f.mode, f.mode_source) == (
        PREFIX_PUSH,
        INFERRED,
        "push",
        "traces",
    )
    assert f.joined == N and [r.request_id for r in f.requests if r] == [
        f"{PREFIX_PUSH}{i}" for i in range(N)
    ]
    # row 0's id has three traces (ready check, warm-up, the run): the run's is taken
    assert f.duplicates == [f"{PREFIX_PUSH}0"] and f.duplicate_traces == 2
    row0 = f.requests[0]
    assert row0 is not None
    assert (res.rows[0].ttft_s or 0) * 1000 - row0.ttft_ms == pytest.approx(1.0)  # type: ignore[operator]
    t = bj.to_json()["totals"]
    assert t["duplicate_ids"] == 1 and t["duplicate_traces"] == 2
    assert t["traces_unclaimed"] == N + 2  # the pull run and the two extra row-0 traces
    (p,) = t["prefixes"]
    assert p["prefix"] == PREFIX_PUSH and p["source"] == INFERRED and p["matched"] == N
    mc = bj.cells[0].modes["push"]
    assert mc.agreement.median_abs_gap_ms == pytest.approx(1.0)
    # given, the prefix is used as is; a wrong one joins nothing
    assert join([res], run, PREFIX_PUSH).files[0].prefix_source == GIVEN
    wrong = join([res], run, "nope-")
    assert wrong.joined == 0 and wrong.to_json()["totals"]["unjoined_examples"][0] == "nope-0"


def test_failed_row_is_sent_and_joined_but_not_measured(
    vllm_style: tuple[Path, Path, RunAnalysis], tmp_path: Path
) -> None:
    path, _, run = vllm_style
    data = json.loads(path.read_text())
    data["errors"][3], data["ttfts"][3] = "Bad Gateway", 0.0  # as vLLM records a failure
    res = read_result(write_json(tmp_path / "r.json", data))
    mc = join([res], run, PREFIX_PUSH).cells[0].modes["push"]
    assert (mc.sent, mc.succeeded, mc.joined) == (N, N - 1, N)
    assert mc.client_ttft_ms["n"] == mc.agreement.n == N - 1


def test_exact_tie_is_refused(vllm_style: tuple[Path, Path, RunAnalysis]) -> None:
    """Two prefixes that fit a file equally well: neither is guessed."""
    path, _, run = vllm_style
    res = read_result(path)
    twins = [
        dataclasses.replace(r, request_id=f"{p}{i}", trace_id=f"{p}{i}")
        for p in ("a-", "b-")
        for i, r in enumerate(run.by_mode("push")[:N])
    ]
    guess = infer_prefix(res, RunAnalysis(twins, {}))
    assert guess.prefix is None and "ambiguous" in guess.note
    bj = join([res], RunAnalysis(twins, {}))
    assert bj.joined == 0 and bj.files[0].prefix_source == NONE
    assert any("ambiguous" in n for n in bj.notes)


def test_render_bench_table(sweep: tuple[Path, RunAnalysis]) -> None:
    root, run = sweep
    text = render_bench(join(load_results(root)[0], run))
    assert "Benchmark results: 4 files, 64 requests, 64 joined to traces (100.0%)" in text
    assert "in256 qps2: 2 QPS, 256-token prompts" in text
    assert "in1024 qps4: 4 QPS, 1024-token prompts" in text
    for label in ("client TTFT p99 ms", "client TPOT p50 ms", "client - span TTFT", "push/pull"):
        assert label in text
    assert "+10.0%" in text
    assert "where the TTFT difference goes" in text and "push is " in text


# ------------------------------------------------------------------ CLI


def test_cli_bench_table_and_json(
    sweep: tuple[Path, RunAnalysis], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root, _ = sweep
    assert cli_main(["report", "--bench", str(root)]) == 0  # traces named by the files
    out = capsys.readouterr().out
    assert "Benchmark results: 4 files" in out and "where the TTFT difference goes" in out
    dest = tmp_path / "bench.json"
    argv = ["report", "--bench", str(root / cell_filename("push", 2.0, 256))]
    argv += ["--bench", str(root / cell_filename("pull", 2.0, 256))]
    argv += ["--traces", str(root / "traces"), "--format", "json", "--out", str(dest)]
    assert cli_main(argv) == 0
    doc = json.loads(dest.read_text())
    assert doc["version"] == 1 and doc["totals"]["files"] == 2
    assert doc["totals"]["joined_fraction"] == 1.0
    (cell,) = doc["cells"]
    assert set(cell) >= {"modes", "ratios", "ttft_account", "explanation", "tpot_account"}
    assert set(cell["modes"]["pull"]["agreement"]) == {
        "n",
        "median_gap_pct",
        "median_abs_gap_pct",
        "median_abs_gap_ms",
        "legs_n",
        "median_send_ms",
        "median_receive_ms",
        "max_send_ms",
        "max_receive_ms",
        "outside",
        "outside_examples",
    }
    assert cell["modes"]["pull"]["agreement"]["legs_n"] == 0  # no clock in the block


def test_cli_bench_vllm_file(
    vllm_style: tuple[Path, Path, RunAnalysis], capsys: pytest.CaptureFixture[str]
) -> None:
    path, traces, _ = vllm_style
    # no block naming the traces: PATH/traces (beside a file) is where they are
    assert cli_main(["report", "--bench", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["prefixes"][0]["prefix"] == PREFIX_PUSH
    argv = ["report", "--bench", str(path), "--traces", str(traces)]
    assert cli_main([*argv, "--request-id-prefix", PREFIX_PULL]) == 0  # right ids, wrong run
    assert cli_main([*argv, "--request-id-prefix", "nope-"]) == 1
    err = capsys.readouterr().err
    assert "no benchmark request joined to a trace" in err and "Traceback" not in err


def test_cli_bench_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_result = write_json(tmp_path / "report.json", {"version": 2, "requests": []})
    assert cli_main(["report", "--bench", str(not_result), "--traces", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no per-request arrays" in err and "--save-detailed" in err
    (tmp_path / "broken.json").write_text("{not json")
    assert cli_main(["report", "--bench", str(tmp_path / "broken.json")]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert cli_main(["report", "--bench", str(tmp_path / "absent")]) == 2
    assert "absent: no such file or directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["report", "--bench", str(empty)]) == 2
    assert "no benchmark result files" in capsys.readouterr().err
    # a result without any traces to join to: say to pass --traces
    res = write_json(empty / "r.json", vllm_result([], gap=0.0))
    assert cli_main(["report", "--bench", str(res)]) == 2
    assert "pass --traces" in capsys.readouterr().err
    assert cli_main(["report", "--bench", str(res), "--format", "perfetto"]) == 2
    assert cli_main(["report"]) == 2
    assert "one of --traces, --jaeger or --bench" in capsys.readouterr().err
    missing = tmp_path / "gone"
    assert cli_main(["report", "--bench", str(res), "--traces", str(missing)]) == 2
    assert "gone: no such file or directory" in capsys.readouterr().err


# ------------------------------------------------------------------ client legs

PERF_OFFSET_NS = 1_700_000_000 * 10**9 - 12_345_678  # Unix - perf_counter on "this host"


def _timed_result(
    run: RunAnalysis, ids: Sequence[str], send_ms: float, receive_ms: float
) -> dict[str, Any]:
    """A sweep cell whose client stamped its rows with perf_counter, `send_ms` before
    the proxy's receipt, and had the first token `receive_ms` after the proxy sent it."""
    reqs = [run.get(i) for i in ids]
    data = vllm_result(reqs, gap=0.0, extra_ms=send_ms + receive_ms, ours={"mode": "push"})  # type: ignore[arg-type]
    data["start_times"] = [
        (r.start_unix_ms - send_ms) / 1000.0 - PERF_OFFSET_NS / 1e9
        for r in reqs  # type: ignore[union-attr]
    ]
    data[OURS][CLOCK] = {
        "host": "here",
        "proxy_on_this_host": True,
        "readings": [[0, PERF_OFFSET_NS], [10**15, PERF_OFFSET_NS + 10**15]],
    }
    return data


def test_a_client_on_the_proxys_clock_splits_the_gap_into_send_and_receive(
    sweep: tuple[Path, RunAnalysis],
) -> None:
    """The client's TTFT minus the proxy's is measured in two parts, per request, and a
    wrong join (each row given the next row's trace) puts the proxy's window outside
    the client's on every row, where a median bound on the gap would not notice."""
    _, run = sweep
    ids = [our_id("push", 256, i) for i in range(N)]
    data = _timed_result(run, ids, send_ms=2.0, receive_ms=0.5)
    result = parse_result(data, Path("push.json"))
    ag = join([result], run).cells[0].modes["push"].agreement
    assert ag.legs_n == N and ag.outside == []
    assert ag.median_send_ms == pytest.approx(2.0, abs=1e-3)
    assert ag.median_receive_ms == pytest.approx(0.5, abs=1e-3)

    data["request_ids"] = ids[1:] + ids[:1]
    shifted = join([parse_result(data, Path("push.json"))], run).cells[0].modes["push"]
    assert len(shifted.agreement.outside) == N

    text = render_bench(join([result], run))
    assert "send 2.0, receive 0.5 ms" in text


def test_the_clock_is_used_only_when_the_proxy_shares_it() -> None:
    block = {"proxy_on_this_host": True, "readings": [[10, 1000], [20, 1011]]}
    clock = ClientClock.parse(block)
    assert clock is not None and clock.drift_ms == pytest.approx(1e-6)
    assert clock.unix_ms(15e-9) == pytest.approx(1005.5e-6)  # offset interpolated
    assert ClientClock.parse({**block, "proxy_on_this_host": False}) is None
    assert ClientClock.parse({**block, "readings": [[1.5, 2]]}) is None
    assert ClientClock.parse({**block, "readings": []}) is None
    assert ClientClock.parse("clock") is None
