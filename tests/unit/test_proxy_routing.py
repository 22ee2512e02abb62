"""xPyD instance choice: least outstanding, ties round robin, unhealthy skipped."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp.test_utils import TestServer

from tracedpush.proxy.routing import (
    SLOW_CHECKS_UNHEALTHY,
    HealthMonitor,
    Instance,
    Pool,
    check_health,
)
from tracedpush.testing.stub_engine import StubEngine


def pool(n: int) -> Pool:
    return Pool("decode", [Instance("decode", f"http://d{i}:8200") for i in range(n)])


def urls(picks: list[Instance]) -> list[str]:
    return [inst.url.split("//")[1].split(":")[0] for inst in picks]


def test_idle_pool_is_round_robin():
    p = pool(3)
    assert urls([p.pick() for _ in range(7)]) == ["d0", "d1", "d2", "d0", "d1", "d2", "d0"]


def test_least_outstanding_wins_and_ties_rotate():
    p = pool(3)
    d0, d1, d2 = p.instances
    d0.outstanding, d1.outstanding, d2.outstanding = 2, 0, 1
    assert p.pick() is d1
    d1.outstanding = 2
    assert p.pick() is d2
    d2.outstanding = 2  # all tied again: rotation continues after d2
    assert p.pick() is d0
    assert p.pick() is d1


def test_acquire_counts_in_flight_requests_even_on_error():
    p = pool(2)
    first = p.pick()
    with p.acquire(first):
        assert first.outstanding == 1
        assert p.pick() is not first
    assert first.outstanding == 0
    try:
        with p.acquire(first):
            raise RuntimeError
    except RuntimeError:
        pass
    assert first.outstanding == 0


def test_unhealthy_instances_are_skipped_and_come_back():
    p = pool(3)
    d0, d1, d2 = p.instances
    d1.mark(False, "refused")
    assert urls([p.pick() for _ in range(4)]) == ["d0", "d2", "d0", "d2"]
    d0.mark(False, "refused")
    d2.mark(False, "refused")
    assert p.pick() is None
    d1.mark(True)
    assert p.pick() is d1
    assert p.healthy_count == 1


def test_unchecked_instances_are_usable_but_not_counted_healthy():
    p = pool(1)
    assert p.instances[0].healthy is None
    assert p.pick() is p.instances[0]
    assert p.healthy_count == 0


def test_health_checks_against_stub_engines():
    """Stub aiohttp servers stand in for vLLM's /health (no engine runs here)."""

    async def scenario() -> None:
        good, sick = StubEngine("decode"), StubEngine("decode", healthy=False)
        servers = [TestServer(good.app()), TestServer(sick.app())]
        for server in servers:
            await server.start_server()
        # A port with nothing listening: bind, note the port, close.
        probe = TestServer(StubEngine("decode").app())
        await probe.start_server()
        dead_url = str(probe.make_url("")).rstrip("/")
        await probe.close()
        instances = [
            Instance("decode", str(servers[0].make_url("")).rstrip("/")),
            Instance("decode", str(servers[1].make_url("")).rstrip("/")),
            Instance("decode", dead_url),
        ]
        turned_healthy: list[Instance] = []

        async def on_healthy(inst: Instance) -> None:
            turned_healthy.append(inst)

        async with aiohttp.ClientSession() as session:
            monitor = HealthMonitor(session, instances, 60, 2.0, on_healthy)
            await monitor.check_all()
            await asyncio.sleep(0)  # let the follow-up task run
            assert [i.healthy for i in instances] == [True, False, False]
            assert "503" in instances[1].last_error
            assert instances[2].last_error
            assert turned_healthy == [instances[0]]
            sick.healthy = True
            assert await check_health(session, instances[1], 2.0)
            await monitor.stop()
        for server in servers:
            await server.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_slow_health_check_counts_only_when_repeated():
    """A busy engine answers /health late; only repeated silence marks it unhealthy."""

    async def scenario() -> None:
        stub = StubEngine("decode", health_delay=2.0)
        server = TestServer(stub.app())
        await server.start_server()
        inst = Instance("decode", str(server.make_url("")).rstrip("/"))
        async with aiohttp.ClientSession() as session:
            inst.mark(True)
            for _ in range(SLOW_CHECKS_UNHEALTHY - 1):
                assert await check_health(session, inst, 0.05)
                assert inst.healthy and inst.usable
            assert not await check_health(session, inst, 0.05)
            assert inst.healthy is False and "timed out" in inst.last_error
            stub.health_delay = 0
            assert await check_health(session, inst, 2.0)
            assert inst.slow_checks == 0
        await server.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
