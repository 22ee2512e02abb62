"""Reading vLLM's SSE stream: whole events only, and what each one carries."""

from __future__ import annotations

import json

from tracedpush.proxy.sse import EventSplitter, inspect_chunk, inspect_event


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_events_are_reassembled_across_arbitrary_chunk_boundaries():
    stream = event({"choices": [{"text": "a"}]}) + event({"choices": [{"text": "b"}]})
    stream += b"data: [DONE]\n\n"
    for size in (1, 2, 7, len(stream)):
        splitter = EventSplitter()
        out = []
        for i in range(0, len(stream), size):
            out += splitter.feed(stream[i : i + size])
        assert b"".join(out) == stream and len(out) == 3
        assert splitter.rest() is None


def test_crlf_separators_and_an_unterminated_last_event():
    splitter = EventSplitter()
    assert splitter.feed(b"data: 1\r\n\r\ndata: 2\n\ndata: 3") == [
        b"data: 1\r\n\r\n",
        b"data: 2\n\n",
    ]
    assert splitter.rest() == b"data: 3"


def test_every_chunk_with_choices_is_a_token_chunk():
    """As vLLM's benchmark client and tracedpush.bench count them (TTFTs must agree)."""
    assert inspect_event(event({"choices": [{"index": 0, "text": "hi"}]})).has_token
    # empty text: a token holding part of a multi-byte character, or a special token
    assert inspect_chunk({"choices": [{"index": 0, "text": ""}]}).has_token
    # chat's role chunk is sent with the first token
    role_only = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert inspect_chunk(role_only).has_token
    assert not inspect_chunk({"choices": []}).has_token
    assert not inspect_chunk({"object": "x"}).has_token


def test_usage_done_and_error_events():
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    info = inspect_event(event({"choices": [], "usage": usage}))
    assert info.usage == usage and info.usage_only and not info.has_token
    info = inspect_event(event({"choices": [{"text": "a"}], "usage": usage}))
    assert info.usage == usage and not info.usage_only and info.has_token
    assert inspect_event(b"data: [DONE]\n\n").done
    assert inspect_event(event({"error": {"message": "boom"}})).error == "boom"
    assert inspect_event(b": keep-alive comment\n\n") == inspect_event(b"data: not json\n\n")
