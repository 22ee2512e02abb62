"""Loading trace files: formats, malformed input, partial lines, incremental refresh."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tracedpush import semconv as sc
from tracedpush.analysis import TraceStore, analyze
from tracedpush.testing import synthetic


@pytest.fixture(scope="module")
def gen() -> synthetic.SyntheticRun:
    return synthetic.generate(40, seed=4, batch=16)


def _lines(gen: synthetic.SyntheticRun) -> list[str]:
    return [json.dumps(d) for d in gen.documents]


def _span_count(gen: synthetic.SyntheticRun) -> int:
    return sum(
        len(ss["spans"])
        for d in gen.documents
        for rs in d["resourceSpans"]
        for ss in rs["scopeSpans"]
    )


def test_directory_is_read_recursively(tmp_path: Path, gen: synthetic.SyntheticRun) -> None:
    gen.write(tmp_path / "run1")  # push/ and pull/ subdirectories
    (tmp_path / "notes.txt").write_text("not a trace file")
    store = TraceStore.from_path(tmp_path)
    assert store.stats.spans == _span_count(gen)
    assert store.stats.files == len(gen.files)
    assert store.stats.malformed == 0
    assert len(store) == 40 + 8  # + a step trace per engine process (4) and mode (2)
    run = analyze(store)
    assert sorted(r.trace_id for r in run.requests) == sorted(gen.by_trace())


def test_malformed_lines_are_skipped_and_counted(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    good = _lines(gen)
    wrong_shape = json.dumps({"hello": "world"})
    bad_span = json.loads(good[0])
    bad_span["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["startTimeUnixNano"] = "soon"
    f = tmp_path / "mixed.jsonl"
    f.write_text(
        "\n".join(
            [
                good[0][: len(good[0]) // 2],
                *good[1:],
                "{not json",
                wrong_shape,
                json.dumps(bad_span),
                "",
                "[1, 2",
            ]
        )
        + "\n"
    )
    store = TraceStore.from_path(f)
    st = store.stats
    # torn first line, "{not json", wrong shape, "[1, 2" = 4 lines; 1 bad span in a good doc
    assert st.malformed == 5
    first_doc_spans = sum(
        len(ss["spans"]) for rs in bad_span["resourceSpans"] for ss in rs["scopeSpans"]
    )
    assert st.spans == _span_count(gen) - 1  # doc 0 arrives once, via bad_span, minus 1
    assert first_doc_spans > 1
    assert st.errors  # a human-readable reason was kept
    analyze(store)  # and the analysis still runs


def test_partial_trailing_line_waits_for_the_writer(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    lines = _lines(gen)
    f = tmp_path / "live.jsonl"
    half = len(lines[1]) // 2
    f.write_text(lines[0] + "\n" + lines[1][:half])
    store = TraceStore.from_path(f)
    n0 = store.stats.spans
    assert store.stats.malformed == 0 and store.stats.partial == 1
    with f.open("a") as fh:
        fh.write(lines[1][half:] + "\n")
    added = store.refresh()
    assert added > 0 and store.stats.spans == n0 + added
    assert store.stats.malformed == 0 and store.stats.partial == 0


def test_torn_line_counts_once_the_file_stops_growing(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    lines = _lines(gen)
    f = tmp_path / "killed.jsonl"
    f.write_text(lines[0] + "\n" + lines[1][:100])
    store = TraceStore.from_path(f)
    assert store.stats.malformed == 0
    assert store.refresh() == 0  # nothing new, and the writer is gone
    assert store.stats.malformed == 1 and store.stats.partial == 0


def test_last_line_without_newline_is_accepted(tmp_path: Path, gen: synthetic.SyntheticRun) -> None:
    lines = _lines(gen)
    f = tmp_path / "nonl.jsonl"
    f.write_text("\n".join(lines[:3]))  # no trailing newline
    store = TraceStore.from_path(f)
    store.refresh()
    assert store.stats.malformed == 0
    expected = sum(
        len(ss["spans"])
        for d in gen.documents[:3]
        for rs in d["resourceSpans"]
        for ss in rs["scopeSpans"]
    )
    assert store.stats.spans == expected


def test_refresh_reads_only_new_bytes(tmp_path: Path, gen: synthetic.SyntheticRun) -> None:
    lines = _lines(gen)
    f = tmp_path / "grow.jsonl"
    f.write_text("\n".join(lines[:5]) + "\n")
    store = TraceStore.from_path(tmp_path)
    read0, spans0 = store.stats.bytes_read, store.stats.spans
    assert read0 == f.stat().st_size
    assert store.refresh() == 0 and store.stats.bytes_read == read0
    tail = "\n".join(lines[5:]) + "\n"
    with f.open("a") as fh:
        fh.write(tail)
    added = store.refresh()
    assert store.stats.bytes_read == read0 + len(tail.encode())
    assert added == _span_count(gen) - spans0
    assert store.version == 2
    # a new file appearing in the directory is picked up too
    other = tmp_path / "sub" / "other.jsonl"
    other.parent.mkdir()
    other.write_text(lines[0] + "\n")  # spans already seen: duplicates, not new
    assert store.refresh() == 0
    assert store.stats.duplicates > 0


def test_rewritten_file_is_reread(tmp_path: Path, gen: synthetic.SyntheticRun) -> None:
    lines = _lines(gen)
    f = tmp_path / "rot.jsonl"
    f.write_text("\n".join(lines) + "\n")
    store = TraceStore.from_path(f)
    f.write_text(lines[0] + "\n")  # truncated / rotated
    assert store.refresh() == 0  # same spans again: duplicates
    assert store.stats.malformed == 0


def test_collector_style_pretty_json_base64_ids_and_enum_strings(tmp_path: Path) -> None:
    gen = synthetic.generate(6, seed=9)
    doc = {"resourceSpans": [rs for d in gen.documents for rs in d["resourceSpans"]]}
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                s["traceId"] = base64.b64encode(bytes.fromhex(s["traceId"])).decode()
                s["spanId"] = base64.b64encode(bytes.fromhex(s["spanId"])).decode()
                if s["parentSpanId"]:
                    s["parentSpanId"] = base64.b64encode(bytes.fromhex(s["parentSpanId"])).decode()
                s["kind"] = {1: "SPAN_KIND_INTERNAL", 2: "SPAN_KIND_SERVER", 3: "SPAN_KIND_CLIENT"}[
                    s["kind"]
                ]
                s["status"] = {"code": "STATUS_CODE_UNSET"}
    f = tmp_path / "collector.json"
    f.write_text(json.dumps(doc, indent=2))
    store = TraceStore.from_path(f)
    assert store.stats.malformed == 0
    run = analyze(store)
    truth = gen.by_trace()
    assert sorted(r.trace_id for r in run.requests) == sorted(truth)
    for r in run.requests:
        assert r.ttft_ms == pytest.approx(truth[r.trace_id].ttft_ms, abs=1e-3)
        assert r.complete
    root = next(s for s in store.all_spans() if s.name == sc.SPAN_REQUEST)
    assert root.kind == 2 and len(root.span_id) == 16


def test_snake_case_protobuf_json(tmp_path: Path) -> None:
    gen = synthetic.generate(2, seed=1)

    def snake(o: object) -> object:
        import re

        if isinstance(o, dict):
            return {
                (k if k == "key" else re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower()): snake(v)
                for k, v in o.items()
            }
        if isinstance(o, list):
            return [snake(v) for v in o]
        return o

    docs = [snake(d) for d in gen.documents]
    store = TraceStore.from_documents(docs)
    assert store.stats.spans == _span_count(gen) and store.stats.malformed == 0
    assert all(r.complete for r in analyze(store).requests)


def test_missing_directory_is_reported_not_raised(tmp_path: Path) -> None:
    store = TraceStore.from_path(tmp_path / "nope")
    assert len(store) == 0
    assert "no such file" in (store.last_error or "")
    (tmp_path / "nope").mkdir()
    store.refresh()
    assert store.last_error is None


def test_empty_directory_gives_empty_analysis(tmp_path: Path) -> None:
    run = analyze(TraceStore.from_path(tmp_path))
    assert run.requests == [] and run.clock_offsets == {}
    assert run.table() == []


def _split_proxy_from_engines(gen: synthetic.SyntheticRun, root: Path) -> tuple[Path, Path]:
    """The issue-14 layout: engines wrote to their traces_dir, the proxy elsewhere."""
    engines, proxy = root / "engines", root / "proxy"
    for name, docs in gen.files.items():
        target = (proxy if "proxy" in name else engines) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return engines, proxy


def test_several_paths_are_one_store(tmp_path: Path, gen: synthetic.SyntheticRun) -> None:
    engines, proxy = _split_proxy_from_engines(gen, tmp_path)
    alone = analyze(TraceStore.from_path(engines))
    assert alone.requests and not any(r.complete for r in alone.requests)  # no root span
    store = TraceStore.from_paths([engines, proxy])
    assert store.stats.spans == _span_count(gen) and store.stats.files == len(gen.files)
    assert store.describe() == f"{engines}, {proxy}"
    run = analyze(store)
    assert sorted(r.trace_id for r in run.requests) == sorted(gen.by_trace())
    assert all(r.complete for r in run.requests)


def test_overlapping_paths_read_each_file_once(tmp_path: Path, gen: synthetic.SyntheticRun) -> None:
    gen.write(tmp_path)
    one_file = tmp_path / next(iter(gen.files))
    store = TraceStore.from_paths([tmp_path, tmp_path / "push", one_file, tmp_path])
    assert store.stats.files == len(gen.files)
    assert store.stats.spans == _span_count(gen) and store.stats.duplicates == 0
    (tmp_path / "pull" / "late.jsonl").write_text(_lines(gen)[0] + "\n")  # new file
    store.refresh()
    assert store.stats.files == len(gen.files) + 1


def test_a_missing_one_of_several_paths_is_reported(
    tmp_path: Path, gen: synthetic.SyntheticRun
) -> None:
    gen.write(tmp_path / "here")
    store = TraceStore.from_paths([tmp_path / "here", tmp_path / "gone"])
    assert store.stats.spans == _span_count(gen)
    assert store.last_error == f"{tmp_path / 'gone'}: no such file or directory"
    with pytest.raises(ValueError, match="no trace paths"):
        TraceStore.from_paths([])


def test_lines_read_by_msgspec_give_what_json_gives(tmp_path: Path, monkeypatch) -> None:
    """A real run's file, a synthetic run's, and a file of odd lines (torn, wrong shape,
    not UTF-8, a bad span), read as a store with `otlp_fast.document_line` and with
    `json.loads` alone: the same analysis, the same load counts and notes."""
    import gzip

    from tracedpush.analysis import load

    real = Path(__file__).resolve().parent.parent / "data" / "real-run.jsonl.gz"
    (tmp_path / "real.jsonl").write_bytes(gzip.decompress(real.read_bytes()))
    run = synthetic.generate(30, seed=6, batch=8)
    run.write(tmp_path / "synthetic")
    good = _lines(run)
    bad_span = json.loads(good[1])
    bad_span["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["startTimeUnixNano"] = "soon"
    odd = [good[0][:100], json.dumps({"hello": 1}), json.dumps(bad_span), good[2]]
    not_utf8 = good[3].encode().replace(b'"name"', b'"n\xffame"', 1)
    (tmp_path / "odd.jsonl").write_bytes("\n".join(odd).encode() + b"\n" + not_utf8 + b"\n")

    def read() -> tuple[str, dict, list[str]]:
        store = TraceStore.from_path(tmp_path)
        return repr(analyze(store).requests), store.stats.to_json(), store.stats.errors

    fast = read()
    monkeypatch.setattr(load, "document_line", None)
    assert read() == fast
    assert fast[1]["malformed"] >= 4 and fast[1]["spans"] > 1000
