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
from tracedpush.connector.traced import TracedConnectorMixin
from tracedpush.telemetry import events as ev

version.check_seams(NixlPushConnectorWorker, version.WORKER_SEAMS, "NixlPushConnectorWorker")
version.check_seams(NixlPushConnectorWorker, version.PUSH_WORKER_SEAMS, "NixlPushConnectorWorker")


class NixlPushConnector(TracedConnectorMixin, _UpstreamPush):
    """vLLM's push connector plus per-request spans; same protocol, same config keys."""

    _TRACEDPUSH_MODE = "push"

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
