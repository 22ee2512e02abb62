"""Real vLLM NIXL workers in one test process, with NIXL itself faked.

Shared by tests/unit/test_vllm_seams.py (requests and blocks for vLLM's scheduler) and
tests/unit/test_span_builder_tp.py (engines of any TP). `Deployment` builds, per engine,
our connector on vLLM's real scheduler (its NIXL side-channel listener on a loopback
port) and one worker connector per TP rank: vLLM's real `NixlPushConnectorWorker`,
constructed by its own `__init__` for that rank, its KV cache allocated by vLLM's
`allocate_kv_cache` and registered by its own `register_kv_caches` (which starts its
real push-writer thread). Handshakes are vLLM's own, over ZMQ on loopback. Only the
NIXL agent is fake (`FakeNixlAgent`): a notification or a WRITE's completion notice is
put in the receiving agent's inbox, keyed by the sender's agent name, as NIXL does, with
NIXL's types (`add_remote_agent` returns the name as bytes, `get_new_notifs` keys by str).

Patched for the test's duration: `base_worker.NixlWrapper` (the fake agent), vLLM's TP
rank and world size getters (read once, by the worker's `__init__`), and
`CpuPlatform.discover_numa_topology` (so the worker does not pin the test process).
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from math import prod
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.config import KVTransferConfig, ModelConfig, ParallelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.platforms import cpu as cpu_platform
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layer_kv_cache_shape_bytes,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

import tracedpush.connector as ours
from tracedpush import semconv
from tracedpush.testing.net import free_port

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# --------------------------------------------------------------- vLLM's scheduler
def request(rid: str, params: dict[str, Any], n_tokens: int = 40) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=list(range(1, n_tokens + 1)),
        sampling_params=SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": params}),
        pooling_params=None,
        arrival_time=1_700_000_000.0,
    )


def blocks(*ids: int) -> KVCacheBlocks:
    return KVCacheBlocks(blocks=([KVCacheBlock(block_id=i) for i in ids],))


def scheduled(*rids: str) -> SchedulerOutput:
    """An engine step that scheduled these requests (one token each)."""
    output = SchedulerOutput.make_empty()
    output.num_scheduled_tokens = dict.fromkeys(rids, 1)
    return output


def bare(cls: type, **attrs: Any) -> Any:
    """A worker without __init__ (no NIXL agent, no torch.distributed): only `attrs`.

    vLLM's methods then run unchanged on it; one that reads an attribute not given here
    fails with an AttributeError naming it (the seam grew: re-review, then add it)."""
    worker = cls.__new__(cls)
    for key, value in attrs.items():
        setattr(worker, key, value)
    return worker


# ------------------------------------------------------------------- fake NIXL
class Telemetry:
    """What NIXL's get_xfer_telemetry returns (the fields the builder reads)."""

    def __init__(self, total_bytes: int, desc_count: int, xfer_us: float) -> None:
        self.totalBytes = total_bytes
        self.descCount = desc_count
        self.postDuration = 15.0
        self.xferDuration = xfer_us


class Fabric:
    """The agents of one test, by name; a WRITE completes when the test says so."""

    def __init__(self) -> None:
        self.agents: dict[str, FakeNixlAgent] = {}
        self.lock = threading.Lock()
        self.held: set[str] = set()  # agents whose WRITEs stay in progress
        self.writes: list[tuple[str, str, bytes]] = []  # (from, to, notif) as posted
        self.dead: set[str] = set()  # agents of processes that died

    def deliver(self, sender: str, receiver: str | bytes, message: bytes) -> None:
        if _name(receiver) in self.dead:
            raise nixlRemoteDisconnectError("NIXL_ERR_REMOTE_DISCONNECT")
        with self.lock:
            self.agents[_name(receiver)].inbox[sender].append(message)


class nixlRemoteDisconnectError(RuntimeError):
    """What NIXL raises for a peer whose process is gone (UCX endpoint closed)."""


def _name(agent: str | bytes) -> str:
    return agent.decode() if isinstance(agent, bytes) else agent


class FakeNixlAgent:
    """The part of NIXL's `nixl_agent` vLLM's workers call, in memory."""

    fabric: Fabric

    def __init__(self, name: str, config: Any = None) -> None:
        self.name = name
        self.inbox: defaultdict[str, list[bytes]] = defaultdict(list)
        self._handles = iter(range(1, 1 << 30))
        self._dlists: dict[int, str] = {}  # prepped descriptor list -> its agent
        self._xfers: dict[int, tuple[str, bytes, int]] = {}  # handle -> (peer, notif, n)
        self._posted: dict[int, int] = {}  # handle -> when posted (ns)
        self._done: dict[int, int] = {}  # handle -> when it completed (ns)
        self.fabric.agents[name] = self

    # registration and metadata: the agent's name is its metadata
    def get_agent_metadata(self) -> bytes:
        return self.name.encode()

    def add_remote_agent(self, metadata: bytes) -> bytes:
        return metadata  # the peer's name, as bytes: NIXL's loadRemoteMD returns bytes

    def remove_remote_agent(self, name: str) -> None:
        pass

    def check_remote_metadata(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def get_reg_descs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return data

    def get_xfer_descs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return data

    def register_memory(self, *args: Any, **kwargs: Any) -> None:
        return None

    def deregister_memory(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prep_xfer_dlist(self, agent: str | bytes, *args: Any, **kwargs: Any) -> int:
        handle = next(self._handles)
        self._dlists[handle] = _name(agent)
        return handle

    def release_dlist_handle(self, handle: int) -> None:
        pass

    # transfers and notifications
    def make_prepped_xfer(
        self,
        operation: str,
        local_xfer_side: int,
        local_indices: Any,
        remote_xfer_side: int,
        remote_indices: Any,
        notif_msg: bytes = b"",
        backends: Any = None,
    ) -> int:
        handle = 1000 + next(self._handles)
        peer = self._dlists[remote_xfer_side]
        self._xfers[handle] = (peer, notif_msg, len(local_indices))
        return handle

    def transfer(self, handle: int, notif_msg: bytes = b"") -> str:
        peer, notif, _ = self._xfers[handle]
        self._posted[handle] = time.time_ns()
        self.fabric.writes.append((self.name, peer, notif))
        return "PROC"

    def check_xfer_state(self, handle: int) -> str:
        if handle in self._done:
            return "DONE"
        if self.name in self.fabric.held:
            return "PROC"
        peer, notif, _ = self._xfers[handle]
        self._done[handle] = time.time_ns()
        self.fabric.deliver(self.name, peer, notif)  # NIXL notifies once the data landed
        return "DONE"

    def get_xfer_telemetry(self, handle: int) -> Telemetry:
        """Bytes and descriptors moved; xferDuration = post -> completion, as NIXL's."""
        _, _, n_desc = self._xfers[handle]
        xfer_ns = self._done.get(handle, time.time_ns()) - self._posted.get(handle, 0)
        return Telemetry(n_desc * 1024, n_desc, max(xfer_ns, 1000) / 1000)

    def release_xfer_handle(self, handle: int) -> None:
        pass

    def send_notif(
        self, remote_agent_name: str | bytes, notif_msg: bytes, backend: Any = None
    ) -> None:
        self.fabric.deliver(self.name, remote_agent_name, notif_msg)

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        """Keyed by the sender's name as str (NIXL's getNotifs), though vLLM holds the
        names `add_remote_agent` gave it, as bytes."""
        with self.fabric.lock:
            out = {agent: msgs for agent, msgs in self.inbox.items() if msgs}
            self.inbox.clear()
        return out


# ------------------------------------------------------------------- engines
MODEL_LAYERS = 4  # the tiny Qwen2 model (tracedpush.model): 4 layers, 2 KV heads of 32
KV_HEADS = 2
HEAD_SIZE = 32
BLOCK_SIZE = 32  # CPU attention needs a multiple of 32
NUM_BLOCKS = 16
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(MODEL_LAYERS)]


def model_dir() -> Path:
    """The tiny model's directory (vLLM's ModelConfig reads its config), built if absent."""
    from tracedpush.model.build import build_model

    return build_model()


class Engine:
    """One vLLM engine: our connector on vLLM's scheduler, one worker connector per rank."""

    def __init__(
        self,
        deployment: Deployment,
        role: str,
        engine_id: str,
        tp: int,
        traces_dir: Path,
        port: int | None = None,
    ) -> None:
        self.role = role
        self.engine_id = engine_id
        self.tp = tp
        self.port = port or free_port()
        mp = deployment.monkeypatch
        mp.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        mp.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(self.port))
        kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
        config = self._config(deployment.model, kv_role, traces_dir)
        cache = self._kv_cache_config()
        self.scheduler = ours.NixlPushConnector(config, KVConnectorRole.SCHEDULER, cache)
        self.workers: list[Any] = []
        for rank in range(tp):
            deployment.rank[:] = [rank, tp]
            worker = ours.NixlPushConnector(config, KVConnectorRole.WORKER, cache)
            caches = base_worker_allocate(cache)
            worker.register_kv_caches(caches)
            self.workers.append(worker)
        self.scheduler.set_xfer_handshake_metadata_pp_aware(
            {(0, r): w.connector_worker.xfer_handshake_metadata for r, w in enumerate(self.workers)}
        )

    def _config(self, model: Path, kv_role: str, traces_dir: Path) -> VllmConfig:
        config = VllmConfig(
            model_config=ModelConfig(model=str(model), enforce_eager=True, dtype="float16"),
            parallel_config=ParallelConfig(tensor_parallel_size=self.tp),
            kv_transfer_config=KVTransferConfig(
                kv_connector="NixlPushConnector",
                kv_connector_module_path="tracedpush.connector",
                kv_role=kv_role,
                engine_id=self.engine_id,
                kv_buffer_device="cpu",
                kv_connector_extra_config={
                    "tracedpush": {
                        "traces_dir": str(traces_dir),
                        "interval_ms": 20,
                        "sample_threads": False,
                        "producer_watch": False,
                    }
                },
            ),
        )
        config.cache_config.block_size = BLOCK_SIZE
        config.cache_config.kv_cache_layout = "LBHNC"  # as the engine core resolves it on CPU
        return config

    def _kv_cache_config(self) -> KVCacheConfig:
        """What vLLM plans for one rank: its share of the KV heads, one tensor."""
        spec = FullAttentionSpec(
            block_size=BLOCK_SIZE,
            num_kv_heads=KV_HEADS // self.tp,
            head_size=HEAD_SIZE,
            dtype=torch.float16,
        )
        page = prod(compute_layer_kv_cache_shape_bytes(spec, 1)[1:])
        tensor = KVCacheTensor(
            size=page * NUM_BLOCKS * len(LAYERS),
            layers=list(LAYERS),
            layer_stride=page * NUM_BLOCKS,
            block_stride=page,
        )
        return KVCacheConfig(
            num_blocks=NUM_BLOCKS,
            kv_cache_tensors=[tensor],
            kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)],
        )

    def agents(self) -> list[str]:
        return [w.connector_worker.nixl_wrapper.name for w in self.workers]

    def coordinates(self) -> dict[str, Any]:
        """This engine's NIXL coordinates as a push decode request names its producer."""
        return {
            "remote_engine_id": self.engine_id,
            "remote_host": "127.0.0.1",
            "remote_port": self.port,
            "tp_size": self.tp,
            "pp_size": 1,
        }

    def schedule(self, output: SchedulerOutput) -> Any:
        """One engine step: the scheduler builds the metadata every worker gets (each
        its own copy, as vLLM sends it to worker processes), then each rank runs."""
        meta = self.scheduler.build_connector_meta(output)
        for worker in self.workers:
            step(worker, pickle.loads(pickle.dumps(meta)))
        return meta

    def idle_step(self) -> list[Any]:
        """A step with nothing scheduled: every rank polls its transfers."""
        return [step(w, self.scheduler.build_connector_meta(scheduled())) for w in self.workers]

    def shutdown(self) -> None:
        for connector in (*self.workers, self.scheduler):
            connector.shutdown()


def base_worker_allocate(cache: KVCacheConfig) -> dict[str, torch.Tensor]:
    from vllm.v1.worker.utils import allocate_kv_cache

    return allocate_kv_cache(cache, torch.device("cpu"), KVCacheLayout.LBHNC)


def step(worker: Any, meta: Any) -> Any:
    """A worker's connector calls in one engine step, in the model runner's order."""
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    worker.wait_for_save()
    results = worker.get_transfer_results(set())
    worker.get_kv_connector_stats()
    worker.clear_connector_metadata()
    return results


def report(engine: Engine, results: list[Any]) -> None:
    """vLLM's output aggregation: a request is done when every rank reported it."""
    recving = set.intersection(*(set(r.finished_recving or ()) for r in results))
    sending = set.intersection(*(set(r.finished_sending or ()) for r in results))
    if recving or sending:
        engine.scheduler.update_connector_output(
            KVConnectorOutput(finished_recving=recving or None, finished_sending=sending or None)
        )


class Deployment:
    """P and D engines in this process; `shutdown` stops every thread they started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, traces_dir: Path) -> None:
        self.monkeypatch = monkeypatch
        self.traces_dir = traces_dir
        self.model = model_dir()
        self.fabric = Fabric()
        self.rank = [0, 1]
        FakeNixlAgent.fabric = self.fabric
        monkeypatch.setattr(base_worker, "NixlWrapper", FakeNixlAgent)
        monkeypatch.setattr(base_worker, "get_tensor_model_parallel_rank", lambda: self.rank[0])
        monkeypatch.setattr(
            base_worker, "get_tensor_model_parallel_world_size", lambda: self.rank[1]
        )
        monkeypatch.setattr(
            cpu_platform.CpuPlatform, "discover_numa_topology", classmethod(lambda cls: [])
        )
        self.engines: list[Engine] = []

    def engine(self, role: str, engine_id: str, tp: int, port: int | None = None) -> Engine:
        """A new engine; `port` (its side channel) to stand in for one restarted there."""
        engine = Engine(self, role, engine_id, tp, self.traces_dir, port)
        self.engines.append(engine)
        return engine

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.shutdown()


@contextmanager
def deployment(monkeypatch: pytest.MonkeyPatch, traces_dir: Path) -> Iterator[Deployment]:
    d = Deployment(monkeypatch, traces_dir)
    try:
        yield d
    finally:
        d.shutdown()


def until(condition: Callable[[], Any], what: str, timeout_s: float = 20.0) -> Any:
    """Poll `condition` (which may drive engine steps) until it is true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------ one request
# The same request as P and D name it: vLLM appends -<8 hex> to the client's id.
BASE_RID = "cmpl-req-7-0"
P_RID = f"{BASE_RID}-8b86e050"
D_RID = f"{BASE_RID}-a38b6b14"


def prefill(
    p: Engine, traceparent: str = TRACEPARENT, base: str = BASE_RID, block_ids=(1, 2)
) -> None:
    """P computes the request and finishes it: vLLM hands its blocks to each rank's writer."""
    params = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        semconv.KV_PARAMS_TRACE_KEY: {"traceparent": traceparent},
    }
    req = request(f"{base}-8b86e050", params)
    p.scheduler.on_new_request(req)
    assert p.scheduler.get_num_new_matched_tokens(req, 0) == (0, False)
    p.scheduler.update_state_after_alloc(req, blocks(*block_ids), 0)
    p.schedule(scheduled(req.request_id))
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    req.num_computed_tokens = req.num_prompt_tokens
    delay, _ = p.scheduler.request_finished_all_groups(req, (list(block_ids),))
    assert delay  # P keeps the blocks until they are pushed
    p.schedule(scheduled())


def decode(
    d: Engine, p: Engine, traceparent: str = TRACEPARENT, base: str = BASE_RID, block_ids=(5, 6)
) -> Request:
    """D allocates the request's blocks; its writer registers them with P's ranks."""
    params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_request_id": base,
        "remote_block_ids": [],
        **p.coordinates(),
        semconv.KV_PARAMS_TRACE_KEY: {"traceparent": traceparent},
    }
    req = request(f"{base}-a38b6b14", params)
    d.scheduler.on_new_request(req)
    n_tokens, load_async = d.scheduler.get_num_new_matched_tokens(req, 0)
    assert n_tokens > 0 and load_async
    d.scheduler.update_state_after_alloc(req, blocks(*block_ids), n_tokens)
    d.schedule(scheduled())  # waiting for remote KV: allocated, not scheduled
    return req


def steps_until_received(p: Engine, d: Engine, d_rid: str = D_RID) -> None:
    """Engine steps on both sides until every D rank reported the request received."""

    def received() -> bool:
        report(p, p.idle_step())
        results = d.idle_step()
        report(d, results)
        return all(d_rid in (r.finished_recving or ()) for r in results)

    until(received, "D to receive the KV")


def first_token(d: Engine, req: Request, block_ids=(5, 6)) -> None:
    d.schedule(scheduled(req.request_id))  # decode ends: scheduled after the KV came
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    d.scheduler.request_finished_all_groups(req, (list(block_ids),))
