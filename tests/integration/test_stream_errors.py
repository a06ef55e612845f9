"""Bad input gets a clear error and harms nothing else (real engine)."""

from __future__ import annotations

import time

import pytest

from s2l_sglang.stream import (
    ContextTooLong,
    DuplicateStream,
    EmptyChunk,
    StreamClosed,
    StreamError,
    UnknownStream,
)
from tests.helpers import fresh_salt

GREEDY = {"temperature": 0, "max_new_tokens": 8}
TEXT = "A short context about the river Seine, which flows through Paris. "


def test_unknown_stream(engine):
    for call in (engine.append, engine.update):
        with pytest.raises(UnknownStream):
            call("no-such-stream", "x")
    with pytest.raises(UnknownStream):
        engine.finish("no-such-stream")
    with pytest.raises(UnknownStream):
        engine.abort("no-such-stream")


def test_duplicate_open_and_bad_ids(engine):
    engine.open_stream("dup-1", GREEDY, TEXT)
    with pytest.raises(DuplicateStream):
        engine.open_stream("dup-1", GREEDY)
    with pytest.raises(StreamError):
        engine.open_stream("bad::id", GREEDY)
    engine.abort("dup-1")


def test_empty_and_wrongly_typed_chunks(engine):
    engine.open_stream("empty-1", GREEDY)
    with pytest.raises(EmptyChunk):
        engine.append("empty-1", "")
    with pytest.raises(EmptyChunk):
        engine.update("empty-1", "")
    with pytest.raises(StreamError):
        engine.append("empty-1", 42)  # type: ignore[arg-type]
    with pytest.raises(EmptyChunk):
        engine.finish("empty-1")  # nothing to generate from, and nothing harmed:
    engine.append("empty-1", TEXT)  # the stream is still open
    assert engine.finish("empty-1")["output_ids"]
    with pytest.raises(StreamClosed):
        engine.append("empty-1", TEXT)


def test_context_beyond_model_length_aborts_stream_and_others_go_on(engine):
    engine.open_stream("other-1", GREEDY, TEXT)
    engine.open_stream("long-1", GREEDY, TEXT)
    with pytest.raises(ContextTooLong):
        engine.append("long-1", "word " * 9000)
    with pytest.raises(StreamClosed):
        engine.append("long-1", "more")
    question = " Question: which river? Answer:"
    out = engine.finish("other-1", question)
    # the other stream is untouched: its output is a plain request's
    ref = engine.generate(prompt=TEXT + question, sampling_params=GREEDY, cache_salt=fresh_salt())
    assert out["output_ids"] == ref["output_ids"]


def test_abort_mid_prefill_frees_the_stream(engine):
    engine.open_stream("abort-1", GREEDY, TEXT * 40)  # a long first turn, still in flight
    engine.abort("abort-1")
    with pytest.raises(StreamClosed):
        engine.append("abort-1", "x")
    # the same engine keeps serving
    engine.open_stream("after-abort", GREEDY, TEXT)
    assert engine.finish("after-abort", " Which river?")["output_ids"]


def test_idle_stream_is_aborted_after_timeout(engine):
    engine.open_stream("idle-1", GREEDY, TEXT)
    # The idle clock starts once the first chunk's prefill is done; `status` is no activity.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            engine.status("idle-1")
        except StreamClosed as exc:
            assert "idle" in str(exc)
            break
        time.sleep(0.2)
    with pytest.raises(StreamClosed, match="idle"):
        engine.append("idle-1", "late chunk")
