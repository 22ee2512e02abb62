"""Pure pieces of the console: figure builders, click handling, request pairing."""

from __future__ import annotations

from types import SimpleNamespace

from tracedpush.analysis import phases as ph
from tracedpush.console import charts, selection, ui


def test_every_phase_has_its_own_colour():
    colours = [charts.phase_color(p) for p in ph.PHASES]
    assert len(set(colours)) == len(colours)
    assert charts.phase_color("kv.write") == charts.phase_color(ph.WRITE)


def test_lane_labels():
    assert charts.lane_label("vllm-prefill/prefill-0/push_writer") == "P prefill-0 · push_writer"
    assert charts.lane_label("vllm-decode/decode-0/model_runner/tp1") == (
        "D decode-0 · model_runner · tp1"
    )
    assert charts.lane_label("tracedpush-proxy/host:8000/pid 7") == "proxy · pid 7"


def test_timeline_without_requests_is_an_empty_figure():
    fig = charts.timeline([])
    assert not fig.data and "no request" in fig.layout.annotations[0].text


def test_clicked_point_gives_its_trace_id():
    event = {"selection": {"points": [{"customdata": ["push-00001", 3, "abc123"]}]}}
    assert ui.picked_trace_id(event) == "abc123"
    obj = SimpleNamespace(selection=SimpleNamespace(points=[{"customdata": "def"}]))
    assert ui.picked_trace_id(obj) == "def"
    assert ui.picked_trace_id({"selection": {"points": []}}) is None
    assert ui.picked_trace_id(None) is None


def _req(mode, prompt, load, complete=True, ttft=10.0, start=0.0):
    return SimpleNamespace(mode=mode, prompt_tokens=prompt, load=load, complete=complete,
                           ttft_ms=ttft, start_unix_ms=start)  # fmt: skip


def test_counterpart_is_the_nearest_complete_request_of_the_other_mode():
    push = _req("push", 1000, 4)
    near_incomplete = _req("pull", 1000, 4, complete=False)
    near = _req("pull", 1100, 4)
    far = _req("pull", 4000, 4)
    same_mode = _req("push", 1000, 4)
    pool = [near_incomplete, near, far, same_mode]
    assert selection.counterpart(push, pool) is near
    assert selection.counterpart(push, [same_mode]) is None


def test_typical_is_the_median_ttft():
    reqs = [_req("push", 100, 1, ttft=t) for t in (5.0, 1.0, 9.0)]
    assert selection.typical(reqs, "push").ttft_ms == 5.0
    assert selection.typical(reqs, "pull") is None
    assert selection.mode_order(["unknown", "pull", "push"]) == ["push", "pull", "unknown"]
