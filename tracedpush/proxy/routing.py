"""Instance pools for xPyD: least-outstanding choice, ties broken round robin.

Least-outstanding follows load better than plain round robin when requests differ
in length (a P busy with a 3000-token prompt is skipped), and degrades to round robin
when the pool is idle or evenly loaded. Instances whose health check failed, or whose
connection was just refused, are skipped until a check passes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL

from tracedpush.proxy.coords import CoordinateBook, InstanceSpec

log = logging.getLogger(__name__)

SLOW_CHECKS_UNHEALTHY = 3


@dataclass(eq=False)
class Instance:
    """One engine the proxy routes to."""

    role: str  # "prefill" | "decode"
    url: str
    flag_engine_id: str | None = None
    coords: CoordinateBook | None = None  # prefill only
    outstanding: int = 0
    healthy: bool | None = None  # None: not checked yet (treated as usable)
    last_error: str | None = None
    last_check: float | None = None
    slow_checks: int = 0  # consecutive /health timeouts
    resent: int = 0  # legs sent again after it closed a kept-alive connection unanswered

    @classmethod
    def from_spec(cls, spec: InstanceSpec) -> Instance:
        coords = CoordinateBook(spec.url, spec.fields) if spec.role == "prefill" else None
        return cls(role=spec.role, url=spec.url, flag_engine_id=spec.engine_id, coords=coords)

    @property
    def host(self) -> str:
        return URL(self.url).host or ""

    @property
    def port(self) -> int:
        return URL(self.url).port or 0

    @property
    def engine_id(self) -> str | None:
        if self.coords is not None and self.coords.engine_id:
            return self.coords.engine_id
        return self.flag_engine_id

    @property
    def usable(self) -> bool:
        return self.healthy is not False

    def mark(self, healthy: bool, error: str | None = None) -> None:
        if healthy != self.healthy and self.healthy is not None:
            if healthy:
                log.info("%s %s is healthy again", self.role, self.url)
            else:
                log.warning("%s %s is unhealthy: %s", self.role, self.url, error)
        self.healthy, self.last_error = healthy, error
        self.last_check = time.time()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url,
            "healthy": self.healthy,
            "outstanding": self.outstanding,
            "engine_id": self.engine_id,
            "last_error": self.last_error,
        }
        if self.coords is not None:
            out["kv_coordinates"] = self.coords.describe()
        return out


@dataclass(eq=False)
class Pool:
    """The instances of one role, and the choice among them."""

    role: str
    instances: list[Instance]
    _cursor: int = field(default=0, repr=False)

    def pick(self) -> Instance | None:
        """The usable instance with the fewest requests in flight; ties rotate."""
        n = len(self.instances)
        rotated = [self.instances[(self._cursor + i) % n] for i in range(n)]
        usable = [inst for inst in rotated if inst.usable]
        if not usable:
            return None
        best = min(usable, key=lambda inst: inst.outstanding)  # first minimum wins
        self._cursor = (self.instances.index(best) + 1) % n
        return best

    @contextlib.contextmanager
    def acquire(self, instance: Instance) -> Iterator[Instance]:
        instance.outstanding += 1
        try:
            yield instance
        finally:
            instance.outstanding -= 1

    @property
    def healthy_count(self) -> int:
        return sum(1 for inst in self.instances if inst.healthy)


async def check_health(session: aiohttp.ClientSession, instance: Instance, timeout: float) -> bool:
    """GET <url>/health; 200 means healthy. Updates the instance."""
    try:
        async with session.get(
            f"{instance.url}/health", timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            await resp.read()
            ok = resp.status == 200
            instance.mark(ok, None if ok else f"/health answered {resp.status}")
    except TimeoutError:
        # A busy engine answers /health late (its API server shares the CPU with a long
        # prefill): only repeated silence counts against it.
        instance.slow_checks += 1
        if instance.slow_checks >= SLOW_CHECKS_UNHEALTHY:
            instance.mark(False, f"/health timed out {instance.slow_checks} times in a row")
        return instance.usable
    except (aiohttp.ClientError, OSError) as exc:
        instance.mark(False, f"{type(exc).__name__}: {exc}".rstrip(": "))
    instance.slow_checks = 0
    return bool(instance.healthy)


class HealthMonitor:
    """Checks every instance periodically; calls ``on_healthy`` when one turns healthy."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        instances: list[Instance],
        interval: float,
        timeout: float,
        on_healthy: Callable[[Instance], Awaitable[None]] | None = None,
    ) -> None:
        self.session, self.instances = session, instances
        self.interval, self.timeout = interval, timeout
        self.on_healthy = on_healthy
        self._task: asyncio.Task[None] | None = None
        self._followups: set[asyncio.Task[None]] = set()

    async def check_all(self) -> None:
        before = {id(inst): inst.healthy for inst in self.instances}
        await asyncio.gather(*(check_health(self.session, i, self.timeout) for i in self.instances))
        if self.on_healthy is None:
            return
        for inst in self.instances:
            if inst.healthy and not before[id(inst)]:
                task = asyncio.create_task(self.on_healthy(inst))
                self._followups.add(task)
                task.add_done_callback(self._followups.discard)

    async def _loop(self) -> None:
        while True:
            try:
                await self.check_all()
            except Exception:  # a bug here must not stop health checking
                log.exception("health check round failed")
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="tracedpush-health")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._followups) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
