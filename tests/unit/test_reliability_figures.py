"""The `figures` fixture (tests/conftest.py) and benchmarks/reliability.py, without engines.

The fixture: one JSON line per test in $TRACEDPUSH_FIGURES (passed, failed, setup error),
nothing without it. The script: its table, its doc-marker replacement and its run from a
sample figures file (`--from-figures`), failures included.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tracedpush.testing.figures import ENV, Figures, read_figures

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
CONFTEST = ROOT / "tests" / "conftest.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reliability", ROOT / "benchmarks/reliability.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["reliability"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rel = _script()

# ----------------------------------------------------------------------- Figures


def test_figures_write_one_line_when_a_path_is_set(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f.jsonl"
    f = Figures("t.py::test_x[push]", "test_x", {"mode": "push", "obj": object()}, path)
    assert f.enabled
    f.record(a=1, b=2.5, c="x")
    f.record(b=3.0, nan=math.nan, flag=True, none=None)
    f.write("passed")
    f.write("failed")
    lines = read_figures(path)
    assert len(lines) == 2
    assert lines[0]["nodeid"] == "t.py::test_x[push]" and lines[0]["test"] == "test_x"
    assert lines[0]["params"]["mode"] == "push" and isinstance(lines[0]["params"]["obj"], str)
    assert lines[0]["figures"] == {
        "a": 1,
        "b": 3.0,
        "c": "x",
        "nan": None,
        "flag": True,
        "none": None,
    }
    assert [line["outcome"] for line in lines] == ["passed", "failed"]


def test_figures_without_a_path_write_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    f = Figures.from_env("t.py::test_x", "test_x")
    assert not f.enabled
    f.record(a=1)
    f.write("passed")  # no file anywhere, no error
    assert read_figures(tmp_path / "nothing.jsonl") == []


def test_figures_refuse_what_is_not_a_scalar() -> None:
    f = Figures("n", "t")
    with pytest.raises(TypeError, match="'drops'"):
        f.record(drops={"a": 1})  # type: ignore[arg-type]


# ---------------------------------------------------------------- the fixture

TESTS = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("setup fails")

@pytest.mark.parametrize("mode", ["push", "pull"])
def test_ok(figures, mode):
    figures.record(requests_failed=4, answered_within_s=1.5)

def test_fails_after_a_first_figure(figures):
    figures.record(requests_cut=8)
    assert False

def test_setup_error(figures, broken):
    pass

def test_without_the_fixture():
    pass
"""


def test_the_fixture_records_each_test_and_its_outcome(pytester, monkeypatch) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_sample=TESTS)
    path = pytester.path / "figures.jsonl"
    monkeypatch.setenv(ENV, str(path))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1, errors=1)
    lines = {line["nodeid"].split("::")[1]: line for line in read_figures(path)}
    assert set(lines) == {
        "test_ok[push]",
        "test_ok[pull]",
        "test_fails_after_a_first_figure",
        "test_setup_error",
    }
    ok = lines["test_ok[pull]"]
    assert ok["test"] == "test_ok" and ok["params"] == {"mode": "pull"}
    assert ok["outcome"] == "passed"
    assert ok["figures"] == {"requests_failed": 4, "answered_within_s": 1.5}
    assert lines["test_fails_after_a_first_figure"]["outcome"] == "failed"
    assert lines["test_fails_after_a_first_figure"]["figures"] == {"requests_cut": 8}
    assert lines["test_setup_error"]["outcome"] == "error"
    assert lines["test_setup_error"]["params"] == {}


def test_the_fixture_does_nothing_without_the_env_var(pytester, monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_sample=TESTS)
    before = sorted(p.name for p in pytester.path.iterdir())
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3, failed=1, errors=1)
    assert sorted(p.name for p in pytester.path.iterdir()) == before


# ------------------------------------------------------------------ the script


def _record(test: str, figures: dict[str, Any], outcome: str = "passed", **params: str) -> dict:
    ids = "-".join(params.values())
    return {
        "nodeid": f"tests/x.py::{test}[{ids}]",
        "test": test,
        "params": params,
        "outcome": outcome,
        "when": "2026-12-01T10:00:00",
        "figures": figures,
    }


DECODE_KILL = {
    "requests_in_flight": 8,
    "requests_failed": 8,
    "failed_with_502": 3,
    "failed_in_stream": 5,
    "failed_naming_decode": 8,
    "answered_within_s": 0.21,
    "failed_answered_within_s": 0.21,
    "requests_lost": 0,
    "prefill_probes": 4,
    "prefill_probes_healthy": 4,
    "prefill_kv_freed_s": 0.6,
    "decode_back_s": 55.2,
    "requests_after": 16,
    "requests_after_ok": 16,
    "traced_errors": 8,
    "errors": "decode leg failed",
}
PREFILL_KILL = {
    "requests_cut": 8,
    "requests_failed": 4,
    "failed_naming_prefill": 3,
    "failed_decode_gave_up": 1,
    "failed_answered_within_s": 1.7,
    "requests_lost": 0,
    "decode_kv_usage_at_kill": 0.015,
    "decode_kv_freed_after_last_answer_s": 0.5,
    "requests_after": 16,
    "requests_after_ok": 16,
    "traced_errors": 4,
}
HANG = {
    "hang_s": 30.0,
    "hang_times": 2,
    "requests": 144,
    "requests_whole": 144,
    "decode_steps_healthy": 900,
    "decode_steps_hang": 2000,
    "decode_step_p50_healthy_ms": 15.49,
    "decode_step_p50_hang_ms": 15.21,
    "step_p50_ratio": 0.98,
    "engine_processes_counting": 2,
    "spans_dropped_min": 139,
    "spans_dropped_max": 264,
    "spans_dropped_total": 403,
    "spans_after_recovery": 569,
    "store_full_s": 15.0,
    "store_full_times": 3,
    "token_gaps_full": 600,
    "token_gap_p50_room_ms": 20.5,
    "token_gap_p50_full_ms": 21.1,
    "token_gap_full_ratio": 1.03,
    "store_full_dropped_min": 212,
    "store_full_log_lines_max": 2,
    "store_full_counted_in_store": 530,
}
FUZZ = {
    "cases": 100,
    "seconds": 25.0,
    "oracle_accepted": 40,
    "upstream_5xx": 0,
    "engine_4xx": 3,
    "engine_restarts": 0,
    "prefill_idle_after_s": 0.0,
    "decode_idle_after_s": 1.5,
    "status_200": 40,
    "status_400": 57,
    "status_413": 3,
}
SLOW = {
    "slow_readers": 200,
    "streaming": 200,
    "in_flight": 200.0,
    "proxy_rss_growth_mb": 10.8,
    "proxy_cpu_cores": 0.55,
    "fast_ttft_p50_alone_ms": 3.8,
    "fast_ttft_p50_beside_ms": 13.6,
    "fast_ttft_ratio": 3.6,
    "released_s": 0.006,
}


def _leave(prefill: float, decode: float) -> dict:
    return {
        "clients": 4,
        "prefill_kv_freed_s": prefill,
        "decode_kv_freed_s": decode,
        "after_request_tokens": 8,
        "after_request_expected": 8,
    }


def sample() -> list[dict]:
    kill_d = "test_killing_decode_under_load_leaves_prefill_serving"
    kill_p = "test_killing_a_prefill_mid_transfer_leaves_the_other_serving"
    leave = "test_a_client_that_leaves_costs_the_engines_nothing"
    slow = "test_200_slow_readers_cost_the_proxy_little_and_the_other_clients_nothing"
    fuzz = "test_real_engines_survive_fuzzed_requests"
    records = []
    for mode in ("push", "pull"):
        records.append(_record(kill_d, DECODE_KILL, mode=mode))
        records.append(_record(kill_p, PREFILL_KILL, mode=mode))
        records.append(_record(leave, _leave(0.01, 13.0), mode=mode, when="before the first token"))
        records.append(_record(leave, _leave(0.01, 0.06), mode=mode, when="mid-stream"))
        records.append(_record(slow, SLOW, mode=mode))
        records.append(_record(fuzz, FUZZ, mode=mode))
        records.append(
            _record(fuzz + "_soak", FUZZ | {"cases": 1500, "status_200": 1440}, mode=mode)
        )
    records.append(_record("test_a_hanging_collector_never_slows_the_engines", HANG))
    records[-1]["params"] = {}
    return records


def test_the_table_has_every_fault_with_each_modes_figures() -> None:
    records = sample()
    rows = rel.table(records)
    assert len(rows) == len(rel.FAULTS) == 9
    d, p, _, full, leave_row, slow, fuzz, launcher, _ = rows
    assert d["push"].startswith("8/8 failed (3 with a 502, 5 by an SSE error; 8 naming the decode")
    assert "answered 0.2 s after the kill at most; 0 lost" in d["push"]
    assert "P healthy at 4/4 probes; P's KV freed 0.6 s after the kill; D back 55 s" in d["push"]
    assert "16/16 succeeded after" in d["pull"]
    assert "4/8 failed (3 naming the prefill leg, 1 D's error before any token)" in p["push"]
    assert "D's KV usage 0.015 at the kill, 0 0.5 s after the last answer" in p["pull"]
    leave = leave_row["pull"]
    assert leave.index("before the first token: P freed after 0.01 s, D after 13.00 s") < (
        leave.index("mid-stream: P freed after 0.01 s, D after 0.06 s; next request 8/8 tokens")
    )
    assert "200/200 streaming" in slow["push"]
    assert "proxy RSS +10.8 MB, 0.55 of a core" in slow["pull"]
    assert launcher["push"].startswith("unit tests on stand-in servers")
    assert full["push"].startswith(
        "full 3 times, 15 s in all under load: client token gap p50 20.50 ms with room"
    )
    assert "21.10 ms full (x1.03); at least 212 spans dropped per engine" in full["push"]
    assert "at most 2 warning lines per log" in full["push"]
    assert "530 drops recorded in the store; no torn line; 144/144 requests whole" in full["push"]
    assert full["pull"] == "not run (push only)"
    # make test's run and the soak's add up
    assert fuzz["pull"].startswith("1600 cases in 2 runs; statuses 200: 1480, 400: 114, 413: 6")
    assert "0 upstream 5xx; 6 engine 4xx relayed" in fuzz["push"]
    assert "engines idle 1.5 s after the last case at most" in fuzz["push"]
    assert rel.missing(records) == []


def test_the_hang_row_and_what_was_not_run() -> None:
    records = [r for r in sample() if r["params"].get("mode") != "pull"]
    rows = rel.table(records, quick=True)
    hang = next(r for r in rows if r["fault"].startswith("the OTLP"))
    assert hang["push"].startswith(
        "D's step p50 15.49 ms healthy, 15.21 ms during 2 hangs, 30 s in all (x0.98)"
    )
    assert (
        "(x0.98); 139-264 spans dropped and counted per engine process (2 processes)"
        in (hang["push"])
    )
    assert "569 spans arrived once it answered again; 144/144 requests whole" in hang["push"]
    assert hang["pull"] == "not run (push only)"
    kill = rows[0]
    assert kill["pull"] == "not run (`soak`, left out by --quick)"
    assert rel.table(records)[0]["pull"] == "not run"
    assert rel.missing(records, quick=True) == [
        "test_a_client_that_leaves_costs_the_engines_nothing[pull]",
        "test_200_slow_readers_cost_the_proxy_little_and_the_other_clients_nothing[pull]",
        "test_real_engines_survive_fuzzed_requests[pull]",
    ]


def test_the_store_full_row_says_why_it_did_not_run() -> None:
    records = [r for r in sample() if r["test"].startswith("test_a_hanging")]
    records[0]["figures"] = HANG | {"store_full": "not run: mount: permission denied"}
    full = next(r for r in rel.table(records) if r["fault"].startswith("the trace store"))
    assert full["push"] == "not run: mount: permission denied"


def test_a_failed_test_shows_as_failed_with_what_it_got() -> None:
    records = sample()
    records[0] = _record(
        records[0]["test"], {"requests_in_flight": 8, "requests_failed": 8}, "failed", mode="push"
    )
    cell = rel.table(records)[0]["push"]
    assert cell.startswith("FAILED (failed): 8/8 failed (? with a 502")
    assert "P's KV freed ? s" in cell


def test_markdown_table_escapes_pipes_and_joins_lines() -> None:
    rows = [{"fault": "a | b", "expected": "x\ny", "push": "1", "pull": "2", "test": "t.py"}]
    text = rel.markdown_table(rows)
    assert text.splitlines()[2] == "| a \\| b | x y | 1 | 2 | t.py |"


DOC = f"""# Title

intro

{rel.START}
| old | table |
|---|---|
| 1 | 2 |

Figures from the run of long ago.
{rel.END}

## After

kept
"""


def test_replace_between_markers_keeps_the_rest() -> None:
    out = rel.replace_between_markers(DOC, "NEW TABLE\n")
    assert (
        out
        == DOC.split(rel.START)[0] + f"{rel.START}\nNEW TABLE\n{rel.END}" + (DOC.split(rel.END)[1])
    )
    assert "old" not in out and "## After\n\nkept\n" in out
    assert rel.replace_between_markers(out, "NEW TABLE") == out  # idempotent


@pytest.mark.parametrize(
    "doc",
    [
        "no markers",
        f"{rel.START}\nonly a start",
        f"{rel.END}\n{rel.START}\n",
        f"{rel.START}\n{rel.END}\n{rel.START}\n{rel.END}\n",
    ],
)
def test_replace_between_markers_refuses_bad_markers(doc: str) -> None:
    with pytest.raises(ValueError):
        rel.replace_between_markers(doc, "x")


def test_the_script_from_a_figures_file_writes_json_and_the_doc(tmp_path: Path, capsys) -> None:
    records = sample()
    figures = tmp_path / "figures.jsonl"
    figures.write_text("".join(json.dumps(r) + "\n" for r in records))
    doc, out = tmp_path / "reliability.md", tmp_path / "out" / "reliability.json"
    doc.write_text(DOC)
    argv = ["--from-figures", str(figures), "--out", str(out), "--doc", str(doc), "--write-doc"]
    assert rel.main(argv) == 0
    printed = capsys.readouterr().out
    assert "1. D's whole process tree SIGKILLed" in printed and "15 tests recorded: 15 passed" in (
        printed
    )
    report = json.loads(out.read_text())
    assert report["passed"] and report["missing"] == [] and report["when"] == "2026-12-01T10:00:00"
    assert {"machine", "cpus", "python", "vllm", "loadavg_1m"} <= set(report["machine"])
    assert len(report["tests"]) == 15 and len(report["faults"]) == 9
    text = doc.read_text()
    assert "old | table" not in text and "## After\n\nkept\n" in text
    table = text.split(rel.START)[1].split(rel.END)[0]
    assert "| fault | expected | measured: push | measured: pull | test |" in table
    assert table.count("\n| ") == 1 + len(rel.FAULTS)  # header + one line per fault
    assert "Figures from the run of 2026-12-01 (15 passed;" in table


def test_the_script_reports_a_failure_and_writes_no_doc(tmp_path: Path, capsys) -> None:
    records = sample()
    records[3]["outcome"] = "failed"
    figures = tmp_path / "figures.jsonl"
    figures.write_text("".join(json.dumps(r) + "\n" for r in records))
    doc, out = tmp_path / "reliability.md", tmp_path / "reliability-out.json"
    doc.write_text(DOC)
    argv = ["--from-figures", str(figures), "--out", str(out), "--doc", str(doc), "--write-doc"]
    assert rel.main(argv) == 1
    printed = capsys.readouterr().out
    assert f"FAILED: {records[3]['nodeid']}" in printed
    assert "FAILED (failed): before the first token" in printed  # what it got, still printed
    assert not out.exists() and doc.read_text() == DOC
    kept = json.loads((tmp_path / "reliability.json").read_text())
    assert kept["passed"] is False


def test_the_pytest_command_includes_soak_unless_quick() -> None:
    full, quick = rel.pytest_command(False, []), rel.pytest_command(True, ["-k", "x"])
    assert full[full.index("soak or not soak") - 1] == "-m"
    assert quick[quick.index("not soak") - 1] == "-m" and quick[-2:] == ["-k", "x"]
    assert all(t in full for t in rel.TESTS)
