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
    """Feeds on arbitrary chunks; yields complete events (separator included).

    Linear in the bytes fed: each separator is searched for once from where the last
    search stopped, and the buffer is cut once per feed. (It used to cut and search
    again from the start for every event, which was quadratic: one 400 KB chunk of
    events held a core for seconds.)
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        # a separator may straddle the old buffer and the new data
        scan = max(0, len(self._buffer) - 3)
        buf = self._buffer + data
        events: list[bytes] = []
        start = 0
        lf, crlf = buf.find(b"\n\n", scan), buf.find(b"\r\n\r\n", scan)
        while lf >= 0 or crlf >= 0:
            end = lf + 2 if crlf < 0 or 0 <= lf < crlf else crlf + 4
            events.append(buf[start:end])
            start = end
            if 0 <= lf < start:
                lf = buf.find(b"\n\n", start)
            if 0 <= crlf < start:
                crlf = buf.find(b"\r\n\r\n", start)
        self._buffer = buf[start:]
        return events

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
