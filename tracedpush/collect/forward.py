"""Forwarding what the collector receives to another OTLP/HTTP endpoint, off the receive path.

Receiving must never wait on the forward target: `submit` is a length check and a
`deque.append` under a lock never held across I/O; one daemon thread POSTs each request
body as it was received (protobuf, or JSON for a JSON body) with a timeout. A target
that is down or hangs costs at most one timeout per attempt on that thread; meanwhile
the bounded queue fills and further requests are dropped and counted (`queue_full`), and
failed attempts count their spans as `export_failed`, like the connectors' exporters
(telemetry/export.py). One log line when forwarding starts failing, one when it resumes.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass

from tracedpush import semconv

log = logging.getLogger("tracedpush.collect")

DEFAULT_QUEUE = 1024  # export requests (each up to a batch of spans)
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Item:
    body: bytes  # uncompressed
    content_type: str
    spans: int


def traces_url(url: str) -> str:
    """An OTLP/HTTP base URL (`http://host:4318`) or a full `/v1/traces` URL."""
    url = url.rstrip("/")
    return url if url.endswith("/v1/traces") else f"{url}/v1/traces"


class Forwarder:
    """A bounded queue and one thread POSTing to `url`."""

    def __init__(
        self, url: str, max_queue: int = DEFAULT_QUEUE, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.url = traces_url(url)
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.forwarded = 0  # spans the target accepted
        self.dropped: dict[str, int] = {semconv.DROP_QUEUE_FULL: 0, semconv.DROP_EXPORT_FAILED: 0}
        self.failing_since: float | None = None
        self._queue: deque[Item] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._busy = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tracedpush-forward", daemon=True)
        self._thread.start()

    def submit(self, item: Item) -> bool:
        """Queue one request for the target; False (counted) when the queue is full."""
        with self._lock:  # receivers submit from several threads
            if len(self._queue) >= self.max_queue:
                self.dropped[semconv.DROP_QUEUE_FULL] += item.spans
                return False
            self._queue.append(item)
        self._wake.set()
        return True

    @property
    def queued(self) -> int:
        return len(self._queue) + (1 if self._busy else 0)

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            while self._queue and not self._stop:
                self._busy = True
                item = self._queue.popleft()
                self._send(item)
                self._busy = False

    def _send(self, item: Item) -> None:
        req = urllib.request.Request(
            self.url, data=item.body, method="POST", headers={"Content-Type": item.content_type}
        )
        error = ""
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
                ok = 200 <= resp.status < 300
                error = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            ok, error = False, f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:  # refused, timed out, reset
            ok, error = False, repr(exc)
        if ok:
            self.forwarded += item.spans
            if self.failing_since is not None:
                log.warning(
                    "forwarding to %s resumed after %.1f s (%d spans dropped so far)",
                    self.url,
                    time.monotonic() - self.failing_since,
                    sum(self.dropped.values()),
                )
                self.failing_since = None
            return
        self.dropped[semconv.DROP_EXPORT_FAILED] += item.spans
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            log.warning(
                "forwarding to %s failed (%s); dropping spans (counted) until it answers",
                self.url,
                error,
            )

    def flush(self, timeout_s: float) -> bool:
        """Wait until the queue is empty (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._queue or self._busy:
            if time.monotonic() >= deadline:
                return False
            self._wake.set()
            time.sleep(0.01)
        return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Give the queue `timeout_s` (less if the target is failing), then stop: an
        attempt still hanging dies with the process (a daemon thread)."""
        self.flush(min(timeout_s, 0.2) if self.failing_since is not None else timeout_s)
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=0.5)
        lost = len(self._queue)
        if lost or sum(self.dropped.values()):
            log.warning(
                "forwarding to %s: %d spans dropped (%s), %d requests not sent at exit",
                self.url,
                sum(self.dropped.values()),
                ", ".join(f"{r} {n}" for r, n in self.dropped.items() if n) or "none",
                lost,
            )
