"""Server-sent events from vLLM: split into whole events, and read what each carries.

The proxy relays D's stream event by event (never a partial event, so a client never
sees half a JSON chunk) and looks into each one for the first token, token counts and
errors. Splitting is done on raw bytes rather than with ``readline`` because one SSE
line can exceed aiohttp's line limit (large logprobs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_SEPARATORS = (b"\n\n", b"\r\n\r\n")


class EventSplitter:
    """Feeds on arbitrary chunks; yields complete events (separator included)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        events = []
        while True:
            found = [(i, sep) for sep in _SEPARATORS if (i := self._buffer.find(sep)) >= 0]
            if not found:
                return events
            index, sep = min(found)
            end = index + len(sep)
            events.append(self._buffer[:end])
            self._buffer = self._buffer[end:]

    def rest(self) -> bytes | None:
        """What is left at end of stream (an event without its final blank line)."""
        rest, self._buffer = self._buffer, b""
        return rest if rest.strip() else None


@dataclass
class EventInfo:
    """What the proxy needs from one event."""

    done: bool = False  # the ``[DONE]`` sentinel
    has_token: bool = False  # comes from a step that generated a token
    usage: dict[str, Any] | None = None
    usage_only: bool = False  # the ``include_usage`` chunk: no choices, just usage
    error: str | None = None


def event_data(event: bytes) -> str | None:
    lines = [
        line[5:].lstrip(" ") if line.startswith("data:") else None
        for line in event.decode("utf-8", "replace").splitlines()
    ]
    data = [line for line in lines if line is not None]
    return "\n".join(data) if data else None


def inspect_event(event: bytes) -> EventInfo:
    data = event_data(event)
    if data is None:
        return EventInfo()
    if data.strip() == "[DONE]":
        return EventInfo(done=True)
    try:
        chunk = json.loads(data)
    except ValueError:
        return EventInfo()
    return inspect_chunk(chunk)


def inspect_chunk(chunk: Any) -> EventInfo:
    """Token / usage / error facts of one completion or chat-completion chunk."""
    info = EventInfo()
    if not isinstance(chunk, dict):
        return info
    error = chunk.get("error")
    if error:
        info.error = str(error.get("message") if isinstance(error, dict) else error)
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        info.usage = usage
    choices = chunk.get("choices")
    if isinstance(choices, list):
        # Every chunk with choices comes from an engine step that produced a token, even
        # when its text is empty (a token holding part of a multi-byte character, or a
        # special token) and, in chat, the role-only first chunk, which vLLM sends with
        # the first token. This is also what vLLM's benchmark client and
        # tracedpush.bench count, so proxy and client TTFT agree.
        info.has_token = bool(choices)
        info.usage_only = not choices and info.usage is not None
    return info
