"""P's NIXL coordinates: what a push-mode decode request must carry about its prefill.

In push mode P and D are sent at the same time, so D's ``kv_transfer_params`` must name
P (engine id, side-channel host and port, TP and PP size) before P has answered.
Sources, combined per prefill instance (docs/proxy.md, "Prefill coordinates"):

* the flag: ``--prefill 'http://h:8100#engine_id=prefill-0,port=5600,host=h,tp=1,pp=1'``
  (the launcher passes them; nothing to discover);
* P's own answers: every prefill response carries ``kv_transfer_params`` with
  ``remote_engine_id``, ``remote_host``, ``remote_port``, ``tp_size``, ``pp_size``
  (vLLM's ``request_finished`` on P), in push and in pull mode. The proxy learns them
  from each answer; a P whose coordinates are unknown gets its first request sent
  sequentially (P first, then D with what P reported) instead of in parallel;
* optionally a probe (``--kv-discovery probe``): a 1-token prefill sent when P first
  turns healthy, so even the first real request runs in parallel. The probe's KV stays
  pinned on P until its lease expires (``kv_lease_duration``, 30 s by default).

Merging: the *address* D dials (host, port) comes from the flag when given, since the
flag says how the network looks from D; the *identity* (engine id, tp, pp, dcp) comes
from P's latest answer when there is one, since P knows itself. Disagreements are logged.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from yarl import URL

from tracedpush.proxy.params import PREFILL_KV_PARAMS, push_decode_params

log = logging.getLogger(__name__)

PREFILL_FRAGMENT_KEYS = ("engine_id", "host", "port", "tp", "pp", "dcp")
DECODE_FRAGMENT_KEYS = ("engine_id",)


@dataclass(frozen=True)
class KVCoordinates:
    """Where and what P is, as a decode engine needs it to receive P's push."""

    engine_id: str
    host: str
    port: int
    tp_size: int = 1
    pp_size: int = 1
    dcp_size: int | None = None

    def decode_params(self, request_id: str) -> dict[str, Any]:
        return push_decode_params(
            engine_id=self.engine_id,
            host=self.host,
            port=self.port,
            tp_size=self.tp_size,
            pp_size=self.pp_size,
            dcp_size=self.dcp_size,
            request_id=request_id,
        )


@dataclass(frozen=True)
class InstanceSpec:
    """One ``--prefill``/``--decode`` value: base URL plus optional fragment fields."""

    role: str
    url: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def engine_id(self) -> str | None:
        return self.fields.get("engine_id")


def parse_instance(spec: str, role: str) -> InstanceSpec:
    """Parse ``URL[#key=value,key=value]``; ValueError says what is wrong."""
    base, _, fragment = spec.strip().partition("#")
    url = URL(base.rstrip("/"))
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"{role} URL {base!r} must look like http://host:port")
    allowed = PREFILL_FRAGMENT_KEYS if role == "prefill" else DECODE_FRAGMENT_KEYS
    fields: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in fragment.replace("&", ",").split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise ValueError(f"{role} {spec!r}: {item!r} is not key=value")
        if key not in allowed:
            raise ValueError(
                f"{role} {spec!r}: unknown key {key!r} (allowed: {', '.join(allowed)})"
            )
        fields[key] = value.strip()
    for key in ("port", "tp", "pp", "dcp"):
        if key in fields:
            try:
                number = int(fields[key])
            except ValueError:
                raise ValueError(f"{role} {spec!r}: {key} must be an integer") from None
            limit = 65535 if key == "port" else 1 << 16
            if not 1 <= number <= limit:
                raise ValueError(f"{role} {spec!r}: {key}={number} is out of range")
    return InstanceSpec(role=role, url=str(url), fields=fields)


def _check_int(params: dict[str, Any], key: str, *, required: bool, port: bool = False) -> int:
    value = params.get(key)
    if value is None and not required:
        return 0
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if ok and port:
        ok = value < 65536
    if not ok:
        raise ValueError(f"kv_transfer_params.{key} must be a positive integer, got {value!r}")
    return value


def coords_from_params(params: Any) -> KVCoordinates:
    """P's coordinates from the kv_transfer_params P returned; ValueError names the key."""
    if not isinstance(params, dict):
        raise ValueError(f"kv_transfer_params is missing or not an object ({params!r})")
    for key in ("remote_engine_id", "remote_host"):
        if not isinstance(params.get(key), str) or not params[key]:
            raise ValueError(f"kv_transfer_params.{key} must be a non-empty string")
    port = _check_int(params, "remote_port", required=True, port=True)
    tp = _check_int(params, "tp_size", required=True)
    pp = _check_int(params, "pp_size", required=False) or 1
    dcp = _check_int(params, "dcp_size", required=False) or None
    return KVCoordinates(
        engine_id=params["remote_engine_id"],
        host=params["remote_host"],
        port=port,
        tp_size=tp,
        pp_size=pp,
        dcp_size=dcp,
    )


class CoordinateBook:
    """The coordinates of one prefill instance: flag fields plus what P reported."""

    def __init__(self, url: str, fields: dict[str, str]) -> None:
        self.url = url
        self.flag = {k: fields[k] for k in PREFILL_FRAGMENT_KEYS if k in fields}
        self.learned: KVCoordinates | None = None
        self.learned_from: str | None = None  # "response" | "probe"
        self._warned: set[str] = set()

    def effective(self) -> KVCoordinates | None:
        """Coordinates to put in D's params, or None while still unknown."""
        flag, learned = self.flag, self.learned
        engine_id = learned.engine_id if learned else flag.get("engine_id")
        port = int(flag["port"]) if "port" in flag else (learned.port if learned else None)
        if not engine_id or port is None:
            return None
        if "host" in flag:
            host = flag["host"]
        elif learned:
            host = learned.host
        else:
            host = URL(self.url).host or "localhost"
        if learned:
            tp, pp, dcp = learned.tp_size, learned.pp_size, learned.dcp_size
        else:
            tp, pp = int(flag.get("tp", 1)), int(flag.get("pp", 1))
            dcp = int(flag["dcp"]) if "dcp" in flag else None
        return KVCoordinates(engine_id, host, port, tp, pp, dcp)

    @property
    def engine_id(self) -> str | None:
        return self.learned.engine_id if self.learned else self.flag.get("engine_id")

    def learn(self, coords: KVCoordinates, source: str) -> None:
        if coords != self.learned:
            self._report_disagreement(coords)
            if self.learned is not None:
                log.warning(
                    "prefill %s changed coordinates: %s -> %s", self.url, self.learned, coords
                )
            else:
                log.info("prefill %s coordinates from its %s: %s", self.url, source, coords)
        self.learned, self.learned_from = coords, source

    def _report_disagreement(self, coords: KVCoordinates) -> None:
        reported = {
            "engine_id": coords.engine_id,
            "host": coords.host,
            "port": str(coords.port),
            "tp": str(coords.tp_size),
            "pp": str(coords.pp_size),
        }
        for key, value in reported.items():
            given = self.flag.get(key)
            if given is not None and given != value and key not in self._warned:
                self._warned.add(key)
                using = "the flag's" if key in ("host", "port") else "P's"
                log.warning(
                    "prefill %s: flag says %s=%s but P reports %s; using %s value",
                    self.url,
                    key,
                    given,
                    value,
                    using,
                )

    def describe(self) -> dict[str, Any]:
        eff = self.effective()
        return {
            "effective": asdict(eff) if eff else None,
            "flag": dict(self.flag),
            "learned_from": self.learned_from,
        }


async def probe(
    session: aiohttp.ClientSession, url: str, timeout: float, headers: dict[str, str] | None = None
) -> KVCoordinates:
    """Ask P for its coordinates with a 1-token prefill; raise on any failure.

    Costs one KV block pinned on P until the lease expires (P keeps it for a decode
    that never comes), and P's engine keeps stepping meanwhile.
    """
    limit = aiohttp.ClientTimeout(total=timeout)
    async with session.get(f"{url}/v1/models", timeout=limit, headers=headers) as resp:
        resp.raise_for_status()
        models = await resp.json()
    model = models["data"][0]["id"]
    body = {
        "model": model,
        "prompt": "tracedpush coordinate probe",
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": dict(PREFILL_KV_PARAMS),
    }
    probe_headers = {**(headers or {}), "X-Request-Id": f"tp-probe-{uuid.uuid4().hex}"}
    async with session.post(
        f"{url}/v1/completions", json=body, timeout=limit, headers=probe_headers
    ) as resp:
        resp.raise_for_status()
        data = await resp.json()
    return coords_from_params(data.get("kv_transfer_params"))
