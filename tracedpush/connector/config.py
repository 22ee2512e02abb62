"""tracedpush's own connector settings, read from `kv_connector_extra_config["tracedpush"]`.

Example (`--kv-transfer-config`):
    {"kv_connector": "NixlPushConnector", "kv_connector_module_path": "tracedpush.connector",
     ..., "kv_connector_extra_config": {"backends": ["UCX"],
            "tracedpush": {"traces_dir": "/var/log/tracedpush", "service_name": "vllm-prefill"}}}
Standard `OTEL_*` variables choose OTLP export (see `telemetry.export`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tracedpush import semconv
from tracedpush.telemetry.export import ENV_TRACES_DIR

_KEYS = {
    "enabled": bool,
    "traces_dir": str,
    "service_name": str,
    "stale_after_s": (int, float),
    "interval_ms": (int, float),
    "sample_threads": bool,
    "producer_watch": bool,
    "producer_check_after_s": (int, float),
    "producer_renewal": bool,
}


@dataclass(frozen=True)
class TracedConfig:
    enabled: bool = True
    traces_dir: str | None = None
    service_name: str | None = None
    stale_after_s: float = 120.0
    interval_ms: float = 100.0
    sample_threads: bool = True  # engine.threads: /proc CPU per thread, once a second
    # push D: fail receives whose prefill engine refuses connections (producer_watch.py)
    producer_watch: bool = True
    producer_check_after_s: float = 5.0
    # push D: handshake again with a P restarted under its engine id (producer_renewal.py)
    producer_renewal: bool = True

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> TracedConfig:
        raw = (extra or {}).get("tracedpush") or {}
        if not isinstance(raw, dict):
            raise ValueError('kv_connector_extra_config["tracedpush"] must be an object')
        for key, value in raw.items():
            if key not in _KEYS:
                raise ValueError(
                    f'unknown key {key!r} in kv_connector_extra_config["tracedpush"] '
                    f"(known: {', '.join(sorted(_KEYS))})"
                )
            if not isinstance(value, _KEYS[key]) or isinstance(value, bool) != (_KEYS[key] is bool):
                raise ValueError(f'kv_connector_extra_config["tracedpush"]["{key}"] has a bad type')
        enabled = raw.get("enabled", os.environ.get("TRACEDPUSH_DISABLE", "") in ("", "0"))
        return cls(
            enabled=bool(enabled),
            traces_dir=raw.get("traces_dir") or os.environ.get(ENV_TRACES_DIR) or None,
            service_name=raw.get("service_name"),
            stale_after_s=float(raw.get("stale_after_s", cls.stale_after_s)),
            interval_ms=float(raw.get("interval_ms", cls.interval_ms)),
            sample_threads=bool(raw.get("sample_threads", cls.sample_threads)),
            producer_watch=bool(raw.get("producer_watch", cls.producer_watch)),
            producer_check_after_s=float(
                raw.get("producer_check_after_s", cls.producer_check_after_s)
            ),
            producer_renewal=bool(raw.get("producer_renewal", cls.producer_renewal)),
        )

    def service_for(self, role: str) -> str:
        if self.service_name:
            return self.service_name
        return semconv.SERVICE_PREFILL if role == "prefill" else semconv.SERVICE_DECODE
