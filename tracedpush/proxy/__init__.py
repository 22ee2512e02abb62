"""OpenAI-compatible prefill/decode proxy for vLLM's NIXL push and pull connectors.

``create_app(ProxyConfig(...), tracer_provider)`` builds the aiohttp application;
``tracedpush proxy`` (command.py) serves it. docs/proxy.md describes the behaviour.
"""

from tracedpush.proxy.app import ProxyConfig, create_app
from tracedpush.proxy.coords import InstanceSpec, KVCoordinates, parse_instance
from tracedpush.proxy.upstream import Timeouts

__all__ = [
    "InstanceSpec",
    "KVCoordinates",
    "ProxyConfig",
    "Timeouts",
    "create_app",
    "parse_instance",
]
