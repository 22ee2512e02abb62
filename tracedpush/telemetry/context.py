"""Trace identity: W3C traceparent handling and ids derived from request ids.

Every process that sees a request can compute the same trace id from its base request
id, so P and D share one trace even when no proxy propagated a context.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

_SUFFIX_RE = re.compile(r"-[0-9a-fA-F]{8}$")
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


class TraceParent(NamedTuple):
    trace_id: int
    span_id: int
    sampled: bool = True


def base_request_id(request_id: str) -> str:
    """vLLM's `get_base_request_id`: strip the random `-<8 hex>` suffix it appends."""
    return _SUFFIX_RE.sub("", request_id)


_OPENAI_ID_RE = re.compile(r"^(?:cmpl-(?P<c>.+)-\d+|chatcmpl-(?P<chat>.+))$")


def request_key(request_id: str) -> str:
    """The client's X-Request-Id behind an engine's request id.

    vLLM's OpenAI server turns X-Request-Id `X` into `cmpl-X-<choice>` (completions) or
    `chatcmpl-X` (chat), then the engine appends `-<8 hex>`. P and D see the same shape,
    so this key is shared by both and equals the id the proxy records on its spans.
    """
    base = base_request_id(request_id)
    m = _OPENAI_ID_RE.match(base)
    if m is None:
        return base
    return m.group("c") or m.group("chat")


def _digest(data: str, size: int) -> int:
    value = int.from_bytes(hashlib.blake2b(data.encode(), digest_size=size).digest(), "big")
    return value or 1  # all-zero ids are invalid in W3C / OTLP


def trace_id_for(base_id: str) -> int:
    """The trace id of a request that arrived without trace context."""
    return _digest("tracedpush/trace/" + base_id, 16)


def span_id_for(trace_id: int, *parts: str) -> int:
    """A deterministic span id, so separate processes can name the same parent."""
    return _digest(f"{trace_id:032x}/" + "/".join(parts), 8)


def parse_traceparent(value: object) -> TraceParent | None:
    """Parse a W3C traceparent; None for anything malformed (never raises)."""
    if not isinstance(value, str):
        return None
    m = _TRACEPARENT_RE.match(value.strip().lower())
    if not m or m.group(1) == "ff":
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return TraceParent(trace_id, span_id, bool(int(m.group(4), 16) & 1))


_UNSAMPLED_LAST = frozenset("02468aceACE")  # flags' last hex digit with bit 0 (sampled) off


def sampled(traceparent: object) -> bool:
    """False only for a traceparent whose flags say "not sampled" (bit 0 of its last hex
    digit); True without one (a request that bypassed the proxy is traced, as before).

    Cheap enough for the scheduler's hook (no regex, no parsing), and what the builder
    uses too, so the two always agree, even on a malformed value."""
    return not (
        type(traceparent) is str and len(traceparent) == 55 and traceparent[-1] in _UNSAMPLED_LAST
    )


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"
