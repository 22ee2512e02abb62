"""Traced drop-in for vLLM's NixlPullConnector (D READs from P after prefill)."""

from __future__ import annotations

from time import time_ns
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

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        record = self._tp_record
        if record is not None:
            try:
                reqs = self._connector_metadata.reqs_to_recv
                if reqs:
                    now = time_ns()
                    for req_id, meta in reqs.items():
                        remote = meta.remote
                        record(
                            (
                                ev.W_LOAD_START,
                                now,
                                req_id,
                                remote.engine_id if remote else "",
                                remote.request_id if remote else "",
                                sum(len(g) for g in meta.local_block_ids),
                            )
                        )
            except Exception:
                pass
        super().start_load_kv(forward_context, **kwargs)


# vLLM's historical name for the pull connector.
NixlConnector = NixlPullConnector
