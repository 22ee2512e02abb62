"""Read traces from a live Jaeger query service (stdlib HTTP, no client library).

Jaeger's stable API v3 answers in OTLP JSON: ``GET /api/v3/traces?query.service_name=
...&query.start_time_min=...&query.start_time_max=...`` searches, ``GET /api/v3/traces/
{id}`` fetches one trace; answers are ``{"result": TracesData}`` (older releases send the
bare TracesData, or newline-separated results). Jaeger releases without v3 get the
internal ``/api/traces`` API (microsecond times, ``references``, ``processes``).

Refreshing re-queries a window that overlaps the previous one (spans of a request
still in flight arrive later); duplicates are dropped by the store. A search that
returns as many traces as the limit is split in two, so a busy hour is not truncated.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from tracedpush import semconv as sc
from tracedpush.analysis.model import LoadStats
from tracedpush.analysis.otlp import Decoder, Malformed

OVERLAP_S = 120.0  # re-query this much before the previous window's end
MIN_SPLIT_S = 1.0  # do not split search windows finer than this
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float) -> float:
    """ "90s", "30m", "1h", "2d", "1h30m" or a number of seconds -> seconds."""
    if isinstance(text, int | float):
        return float(text)
    s = text.strip()
    try:
        return float(s)
    except ValueError:
        pass
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", s)
    if not parts or "".join(n + u for n, u in parts) != s.replace(" ", ""):
        raise ValueError(f"bad duration {text!r} (use e.g. 90s, 30m, 1h)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class JaegerError(RuntimeError):
    """Jaeger could not be reached or answered with an error."""


class JaegerSource:
    """A `TraceStore` source backed by Jaeger's HTTP query API."""

    def __init__(
        self,
        url: str,
        *,
        service: str | None = None,
        lookback: str | float = "1h",
        trace_ids: Iterable[str] | None = None,
        timeout: float = 10.0,
        limit: int = 500,
        api: str = "auto",  # "auto", "v3" or "legacy"
    ) -> None:
        self.url = url.rstrip("/")
        self.service = service
        self.lookback_s = parse_duration(lookback)
        self.trace_ids = list(trace_ids or [])
        self.timeout = timeout
        self.limit = limit
        self.api = api
        self._until: float | None = None  # end of the last window queried
        self._services: list[str] | None = None
        self.last_error: str | None = None

    def describe(self) -> str:
        return f"jaeger {self.url}" + (f" service={self.service}" if self.service else "")

    # ------------------------------------------------------------------ HTTP
    def _get(self, path: str, params: dict[str, Any] | None, stats: LoadStats) -> bytes | None:
        """GET; None for 404 (nothing found / no such route); JaegerError otherwise."""
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        stats.fetches += 1
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            body = exc.read()[:300].decode("utf-8", "replace")
            raise JaegerError(f"{url}: HTTP {exc.code}: {body}") from exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise JaegerError(f"Jaeger at {self.url} is unreachable: {reason}") from exc
        stats.bytes_read += len(data)
        return data

    @staticmethod
    def _decode(data: bytes, decoder: Decoder, stats: LoadStats) -> int:
        """Decode an answer: one JSON document, or newline-separated ones (streamed)."""
        try:
            doc = json.loads(data)
        except ValueError:
            n = 0
            for line in data.splitlines():
                if not line.strip():
                    continue
                stats.lines_read += 1
                try:
                    n += decoder.document(json.loads(line))
                except (ValueError, Malformed) as exc:
                    stats.malformed += 1
                    stats.note(f"jaeger answer line skipped: {exc}")
            return n
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict) and "result" not in doc:
            err = doc["error"]
            if err.get("httpCode") == 404 or err.get("code") == 5:
                return 0
            raise JaegerError(f"Jaeger error: {err.get('message') or err}")
        if isinstance(doc, dict) and doc.get("errors") and not doc.get("data"):
            raise JaegerError(f"Jaeger errors: {doc['errors']}")
        try:
            return decoder.document(doc)
        except Malformed as exc:
            stats.malformed += 1
            stats.note(f"jaeger answer skipped: {exc}")
            return 0

    # ------------------------------------------------------------------ queries
    def services(self, stats: LoadStats) -> list[str]:
        for path in ("/api/v3/services", "/api/services"):
            data = self._get(path, None, stats)
            if data is None:
                continue
            doc = json.loads(data)
            names = doc.get("services") or doc.get("data") or []
            return [str(n) for n in names]
        return []

    def _services_to_search(self, stats: LoadStats) -> list[str]:
        if self.service:
            return [self.service]
        if self._services is None:
            try:
                names = self.services(stats)
            except (JaegerError, ValueError):
                names = []
            proxies = [n for n in names if n == sc.SERVICE_PROXY or "proxy" in n]
            # every trace through the proxy has the proxy's root span; without proxies
            # (requests sent straight to the engines) search the engines themselves.
            self._services = (
                proxies or [n for n in names if not n.startswith("jaeger")] or [sc.SERVICE_PROXY]
            )
        return self._services

    def trace(self, trace_id: str, decoder: Decoder, stats: LoadStats) -> int:
        if self.api != "legacy":
            data = self._get(f"/api/v3/traces/{trace_id}", {"query.raw_traces": "true"}, stats)
            if data is not None:
                return self._decode(data, decoder, stats)
        data = self._get(f"/api/traces/{trace_id}", {"raw": "true"}, stats)
        return 0 if data is None else self._decode(data, decoder, stats)

    def search(self, service: str, t0: float, t1: float, decoder: Decoder, stats: LoadStats) -> int:
        """Every trace of `service` that started in [t0, t1), splitting full answers."""
        seen: set[str] = set()

        def counting(span: Any) -> None:
            seen.add(span.trace_id)
            decoder.sink(span)

        sub = Decoder(counting, stats)
        sub._resources = decoder._resources  # share interned resources
        n = 0
        if self.api != "legacy":
            params = {
                "query.service_name": service,
                "query.start_time_min": _rfc3339(t0),
                "query.start_time_max": _rfc3339(t1),
                "query.search_depth": self.limit,
                "query.num_traces": self.limit,
                "query.raw_traces": "true",
            }
            data = self._get("/api/v3/traces", params, stats)
            if data is not None:
                n = self._decode(data, sub, stats)
            elif self.api == "auto" and not self._v3_exists(stats):
                self.api = "legacy"
        if self.api == "legacy":
            params = {
                "service": service,
                "start": int(t0 * 1e6),
                "end": int(t1 * 1e6),
                "limit": self.limit,
                "raw": "true",
            }
            data = self._get("/api/traces", params, stats)
            n = 0 if data is None else self._decode(data, sub, stats)
        if len(seen) >= self.limit and t1 - t0 > MIN_SPLIT_S:
            mid = (t0 + t1) / 2.0
            n += self.search(service, t0, mid, decoder, stats)
            n += self.search(service, mid, t1, decoder, stats)
        return n

    def _v3_exists(self, stats: LoadStats) -> bool:
        try:
            return self._get("/api/v3/services", None, stats) is not None
        except JaegerError:
            return False

    # ------------------------------------------------------------------ Source
    def read(self, decoder: Decoder, stats: LoadStats) -> None:
        try:
            if self.trace_ids:
                for tid in self.trace_ids:
                    self.trace(tid, decoder, stats)
                self.last_error = None
                return
            now = time.time()
            t0 = now - self.lookback_s if self._until is None else self._until - OVERLAP_S
            for service in self._services_to_search(stats):
                self.search(service, t0, now + 1.0, decoder, stats)
            self._until = now
            self.last_error = None
        except JaegerError as exc:
            stats.fetch_errors += 1
            self.last_error = str(exc)
            stats.note(str(exc))
        except (ValueError, Malformed) as exc:
            stats.fetch_errors += 1
            self.last_error = f"Jaeger answered something that is not JSON: {exc}"
            stats.note(self.last_error)
