"""Traced drop-in for vLLM's NixlPushConnector (P WRITEs into D's registered blocks)."""

from __future__ import annotations

from time import time_ns
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlPushConnector as _UpstreamPush,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)

from tracedpush.connector import version
from tracedpush.connector.producer_watch import ProducerWatch
from tracedpush.connector.traced import TracedConnectorMixin, log
from tracedpush.telemetry import events as ev

version.check_seams(NixlPushConnectorWorker, version.WORKER_SEAMS, "NixlPushConnectorWorker")
version.check_seams(NixlPushConnectorWorker, version.PUSH_WORKER_SEAMS, "NixlPushConnectorWorker")


class NixlPushConnector(TracedConnectorMixin, _UpstreamPush):
    """vLLM's push connector plus per-request spans; same protocol, same config keys."""

    _TRACEDPUSH_MODE = "push"

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._tp_watch: ProducerWatch | None = None
        worker = getattr(self, "connector_worker", None)
        config = self._tp_config
        if worker is None or self._tp_role != "decode" or not config.producer_watch:
            return
        try:  # independent of tracing: it is about D's blocks, not spans
            version.check_seams(worker, version.PRODUCER_WATCH_SEAMS, type(worker).__name__)
            watch = ProducerWatch(worker, after_s=config.producer_check_after_s)
            self._tp_watch = watch.start()
        except Exception:
            log.exception("tracedpush: no producer watch; vLLM's own behaviour applies")

    def shutdown(self) -> None:
        if self._tp_watch is not None:
            self._tp_watch.stop()
        super().shutdown()

    def _tp_start(self, config: Any, engine_id: str, worker: Any) -> None:
        super()._tp_start(config, engine_id, worker)
        if worker is not None and self._tp_record is not None:
            version.check_seams(worker, version.PUSH_WORKER_SEAMS, type(worker).__name__)
            _wrap_push_start(worker, self._tp_record)

    def _tp_on_load(self, metadata: Any, now: int) -> None:
        """P: finished blocks go to the writer's inbox now (after this step's forward)."""
        finished = metadata.push_finished_blocks
        if finished:
            self._tp_record((ev.HANDOFF, now, tuple(finished)))
        self._tp_loads[0] += len(finished or ()) + len(metadata.reqs_to_recv or ())


def _wrap_push_start(worker: Any, record) -> None:
    """Observe `_do_start_push_kv`: P's writer thread matched a registration (rendezvous)."""
    original = worker._do_start_push_kv

    def _do_start_push_kv(request_id, local_block_ids, registration_data, *args, **kwargs):
        try:
            n_blocks = (
                sum(len(g) for g in local_block_ids)
                if local_block_ids and isinstance(local_block_ids[0], list | tuple)
                else len(local_block_ids or ())
            )
            record(
                (
                    ev.PUSH_START,
                    time_ns(),
                    request_id,
                    registration_data.get("request_id", ""),
                    registration_data.get("decode_engine_id", ""),
                    n_blocks,
                )
            )
        except Exception:
            pass
        return original(request_id, local_block_ids, registration_data, *args, **kwargs)

    worker._do_start_push_kv = _do_start_push_kv
