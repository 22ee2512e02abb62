"""Traced drop-in for vLLM's NixlPullConnector (D READs from P after prefill)."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlPullConnector as _UpstreamPull,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)

from tracedpush.connector import version
from tracedpush.connector.traced import TracedConnectorMixin
from tracedpush.telemetry import events as ev

version.check_seams(NixlPullConnectorWorker, version.WORKER_SEAMS, "NixlPullConnectorWorker")


class NixlPullConnector(TracedConnectorMixin, _UpstreamPull):
    """vLLM's pull connector plus per-request spans; same protocol, same config keys."""

    _TRACEDPUSH_MODE = "pull"

    def _tp_on_load(self, metadata: Any, now: int) -> None:
        reqs = metadata.reqs_to_recv
        if not reqs:
            return
        record = self._tp_record
        for req_id, meta in reqs.items():
            remote = meta.remote
            record(
                (
                    ev.LOAD_START,
                    now,
                    req_id,
                    remote.engine_id if remote else "",
                    remote.request_id if remote else "",
                    sum(len(g) for g in meta.local_block_ids),
                )
            )
        self._tp_loads[0] += len(reqs)


# vLLM's historical name for the pull connector.
NixlConnector = NixlPullConnector
