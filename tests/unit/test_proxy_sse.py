"""Reading vLLM's SSE stream: whole events only, and what each one carries."""

from __future__ import annotations

import json
import random

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


def _split_by_definition(chunks: list[bytes]) -> tuple[list[bytes], bytes]:
    """Events as the SSE rule states them: cut at the earliest blank line, again and again."""
    buf, out = b"", []
    for data in chunks:
        buf += data
        while found := [(i, s) for s in (b"\n\n", b"\r\n\r\n") if (i := buf.find(s)) >= 0]:
            index, sep = min(found)
            out.append(buf[: index + len(sep)])
            buf = buf[index + len(sep) :]
    return out, buf


def test_splitter_agrees_with_the_definition_on_any_chunking():
    """Separators straddling chunks, LF and CRLF mixed, runs of blank lines."""
    rng = random.Random(7)
    for _ in range(3000):
        data = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randint(0, 80)))
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(0, 6))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        splitter = EventSplitter()
        events = [e for chunk in chunks for e in splitter.feed(chunk)]
        expected, rest = _split_by_definition(chunks)
        assert events == expected, (data, cuts)
        assert splitter.rest() == (rest if rest.strip() else None)
