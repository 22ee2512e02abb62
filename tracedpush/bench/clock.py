"""The client's clock, recorded beside its result so the report can read its start times
on the proxy's clock (`analysis.bench_results.ClientClock`).

vLLM's benchmark client (and ours) stamps each request with ``time.perf_counter()``;
spans carry Unix time. On one host both read the same kernel clocks, so a pair of
readings taken together converts one to the other to within microseconds.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import Any
from urllib.parse import urlsplit


def reading() -> list[int]:
    """[perf_counter ns, Unix ns] taken together (the perf counter read on both sides
    of the Unix clock, and averaged)."""
    a = time.perf_counter_ns()
    unix = time.time_ns()
    b = time.perf_counter_ns()
    return [(a + b) // 2, unix]


def on_this_host(url: str) -> bool:
    """Whether `url`'s host is this machine: a loopback address, or one of this host's
    own addresses. Unresolvable: False (the clocks are then not assumed shared)."""
    host = urlsplit(url).hostname or ""
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    if any(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        return True
    try:
        own = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return bool(addrs & own)


def client_clock(proxy_url: str, before: list[int], after: list[int]) -> dict[str, Any]:
    """Our block's ``clock``: the readings around a cell, and whether the proxy shares
    this host's clock."""
    return {
        "host": socket.gethostname(),
        "proxy_on_this_host": on_this_host(proxy_url),
        "readings": [before, after],
    }
