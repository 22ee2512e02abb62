"""`tracedpush bench sweep` without engines: grid, files, resume, refusals.

A fake streaming completions server (`tracedpush.testing.fake_engine`) stands in for the
proxy and its engines, and our own client (`--client tracedpush`) sends to it, so this
runs where vLLM is not installed; the real 1P1D with vLLM's client is
tests/e2e/test_sweep_engines.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracedpush.analysis.bench_results import (
    CLOCK,
    DETAILED_KEYS,
    OURS,
    REQUEST_IDS,
    load_results,
)
from tracedpush.bench import command
from tracedpush.bench.clock import on_this_host
from tracedpush.bench.sweep import PROFILES, cell_done
from tracedpush.model import ensure_model
from tracedpush.testing.fake_engine import FakeEngine, fake_engine

GRID = ["--qps", "20,40", "--input-len", "16,32", "--output-len", "3", "--num-prompts", "4"]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return ensure_model()


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[FakeEngine]:
    with fake_engine(model_dir, token_gap_s=0.002) as fake:
        yield fake


def _sweep(engine: FakeEngine, model_dir: Path, results: Path, *extra: str):
    argv = [
        sys.executable, "-m", "tracedpush", "bench", "sweep", *GRID,
        "--modes", "push", "--warmup", "1", "--results", str(results),
        "--client", "tracedpush", "--proxy", engine.url, "--served-model-name", "tiny",
        "--model", str(model_dir), *extra,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_every_cell_is_a_complete_result_and_a_rerun_resumes(
    engine: FakeEngine, model_dir: Path, tmp_path: Path
) -> None:
    engine.reset()
    run = _sweep(engine, model_dir, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert names == [
        "push-qps20-in16.json",
        "push-qps20-in32.json",
        "push-qps40-in16.json",
        "push-qps40-in32.json",
        "sweep.json",
    ]
    results, skipped = load_results(tmp_path)
    assert skipped == [] and len(results) == 4
    sent = set(engine.ids())
    for r in results:
        data = r.data
        assert data["num_prompts"] == 4 and data["completed"] == 4 and data["failed"] == 0
        assert all(len(data[k]) == 4 for k in (*DETAILED_KEYS, REQUEST_IDS))
        assert data[OURS]["mode"] == "push" and data[OURS]["client"] == "tracedpush"
        assert r.traces is None  # the fake deployment said nothing about its traces
        # every row's id reached the server as its x-request-id, as in the file
        assert set(data[REQUEST_IDS]) <= sent
        assert data["request_rate"] == r.qps and r.input_len in (16, 32)
        # The client's clock: the proxy (here the fake, on 127.0.0.1) shares it, and the
        # rows' start times are that clock (CLOCK_MONOTONIC, system-wide): each row left
        # the client between the two readings and before the server had it.
        assert r.clock is not None and data[OURS][CLOCK]["proxy_on_this_host"] is True
        (first, _), (last, _) = r.clock.readings
        arrived = {s["id"]: s["t"] for s in engine.seen}
        for row in r.rows:
            assert row.start_s is not None and first / 1e9 <= row.start_s <= last / 1e9
            assert row.start_s <= arrived[row.request_id]
    warmups = [i for i in sent if i.startswith("warmup-")]
    assert len(warmups) == 4  # one per cell, never in a result file
    assert len(sent) == 4 * 4 + 4

    # The same command again: everything is done, nothing is sent.
    engine.reset()
    again = _sweep(engine, model_dir, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 cells (4 already done)" in again.stderr
    assert engine.ids() == []


def test_an_unfinished_cell_is_run_again(
    engine: FakeEngine, model_dir: Path, tmp_path: Path
) -> None:
    engine.reset()
    assert _sweep(engine, model_dir, tmp_path).returncode == 0
    done = tmp_path / "push-qps40-in32.json"
    data = json.loads(done.read_text())
    del data[OURS]  # what vLLM had saved before our keys were added: not finished
    done.write_text(json.dumps(data))
    (tmp_path / "push-qps20-in16.json").write_text('{"ttfts": [0.1')  # torn
    assert not cell_done(done)
    engine.reset()
    run = _sweep(engine, model_dir, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "4 cells (2 already done)" in run.stderr
    assert len(engine.ids()) == 2 * (4 + 1)
    assert cell_done(done) and cell_done(tmp_path / "push-qps20-in16.json")


def test_another_grid_in_the_same_directory_is_refused(
    engine: FakeEngine, model_dir: Path, tmp_path: Path
) -> None:
    engine.reset()
    assert _sweep(engine, model_dir, tmp_path).returncode == 0
    other = _sweep(engine, model_dir, tmp_path, "--seed", "7")
    assert other.returncode != 0
    assert "holds a sweep of another grid" in other.stderr and "--force" in other.stderr
    assert "Traceback" not in other.stderr


def test_failed_requests_are_in_the_file_and_the_exit_code(
    engine: FakeEngine, model_dir: Path, tmp_path: Path
) -> None:
    engine.reset()
    engine.fail_if = lambda rid: rid.startswith("sweep-") and rid.endswith("-in16-1")
    run = _sweep(engine, model_dir, tmp_path, "--qps", "20", "--input-len", "16")
    assert run.returncode == 1
    assert "1 request(s) failed" in run.stderr
    data = json.loads((tmp_path / "push-qps20-in16.json").read_text())
    assert (data["completed"], data["failed"]) == (3, 1)
    assert data["errors"][1] and not data["errors"][0]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(["sweep", *argv])


def test_profiles_and_flags_make_the_plan() -> None:
    quick = command.plan_from(_parse("--profile", "quick"))
    prof = PROFILES["quick"]
    assert (quick.qps, quick.input_lens, quick.output_len) == (
        prof.qps,
        prof.input_lens,
        prof.output_len,
    )
    assert len(quick.qps) == len(quick.input_lens) == 2 and quick.modes == ("push", "pull")
    seed = command.plan_from(_parse("--profile", "seed", "--qps", "8,1"))
    assert seed.qps == (1.0, 8.0) and max(seed.input_lens) == 16384
    assert seed.prompts(8.0) == 8 * 60  # qps x duration
    assert (
        command.plan_from(_parse("--qps", "2", "--input-len", "64", "--num-prompts", "9")).prompts(
            2.0
        )
        == 9
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--qps", "0"], "rates must be positive"),
        (["--qps", "fast"], "expected numbers"),
        (["--input-len", "1k"], "expected integers"),
        (["--modes", "push,push"], "push and/or pull once each"),
        (["--num-prompts", "-3"], "must be positive"),
    ],
)
def test_bad_flags_are_refused_with_the_reason(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(*argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_a_grid_is_required() -> None:
    with pytest.raises(SystemExit, match="give --qps and --input-len, or --profile"):
        command.plan_from(_parse())


def test_two_passes_run_abba_and_write_a_file_per_pass(
    engine: FakeEngine, model_dir: Path, tmp_path: Path
) -> None:
    plan = command.plan_from(_parse("--qps", "1", "--input-len", "8", "--passes", "2"))
    assert plan.order() == [("push", 1), ("pull", 1), ("pull", 2), ("push", 2)]
    engine.reset()
    run = _sweep(engine, model_dir, tmp_path, "--qps", "20", "--input-len", "16", "--passes", "2")
    assert run.returncode == 0, run.stderr[-3000:]
    first, second = tmp_path / "push-qps20-in16.json", tmp_path / "push-qps20-in16-pass2.json"
    assert json.loads(first.read_text())[OURS]["pass"] == 1
    assert json.loads(second.read_text())[OURS]["pass"] == 2
    results, _ = load_results(tmp_path)
    assert {(r.mode, r.qps, r.input_len) for r in results} == {("push", 20.0, 16)}


def test_the_proxy_shares_the_clients_clock_only_on_this_host() -> None:
    assert on_this_host("http://127.0.0.1:8000") and on_this_host("http://localhost:8000")
    assert on_this_host("http://[::1]:8000")
    assert not on_this_host("http://203.0.113.7:8000")  # TEST-NET-3: never this host
    assert not on_this_host("http://no-such-host.invalid:8000")
