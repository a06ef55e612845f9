"""A stream's lifecycle in the real engine: the final turn owns the KV only while it generates.

The final turn is a task of the stream manager's own; its outputs go through a bounded queue.
Before, the session (and its KV) was closed only after the reader had taken the last output,
and a stalled reader pinned it indefinitely (the reaper skipped finishing streams).
"""

from __future__ import annotations

import asyncio

import pytest

from s2l_sglang.stream import StreamClosed, StreamError
from s2l_sglang.stream.errors import InvalidSamplingParams, InvalidStreamId, ReaderStalled
from s2l_sglang.stream.manager import OUTPUT_QUEUE, State
from tests.helpers import fresh_salt

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
CONTEXT = (
    "The Danube is the second-longest river in Europe. It flows through much of Central and "
    "Southeastern Europe, from the Black Forest into the Black Sea. "
)
QUESTION = "\nQuestion: Where does the Danube end?\nAnswer:"


async def _until(predicate, timeout_s: float = 120.0) -> None:
    """Wait (bounded) until `predicate()` holds: observable state, not a guessed sleep."""

    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout_s)


def test_final_turn_frees_the_stream_when_generation_ends_not_when_read(engine):
    mgr, sid = engine.streams, "life-slow-reader"

    async def run():
        await mgr.open(sid, GREEDY, CONTEXT)
        outputs = await mgr.finish(sid, QUESTION)
        first = await outputs.__anext__()
        # The reader stops here. Generation ends meanwhile, and with it the stream: its
        # session is closed (KV freed) though most outputs are still unread.
        await _until(lambda: sid not in mgr.streams)
        rest = [out async for out in outputs]
        return first, rest

    first, rest = engine._call(run())
    assert rest, "the unread outputs are still delivered after the close"
    last = rest[-1]
    ref = engine.generate(
        prompt=CONTEXT + QUESTION, sampling_params=GREEDY, cache_salt=fresh_salt()
    )
    assert last["output_ids"] == ref["output_ids"]
    assert last["meta_info"]["stream"]["ttft_s"] > 0 and first["meta_info"]["id"] == sid
    with pytest.raises(StreamClosed, match="finished"):
        engine.status(sid)


def test_a_reader_stalled_past_the_idle_timeout_is_dropped(engine):
    """The engine fixture's idle timeout is 3 s: a reader that takes nothing while the output
    queue is full is dropped, the final turn aborted and the session closed."""
    mgr, sid = engine.streams, "life-stalled-reader"
    long = {"temperature": 0, "max_new_tokens": 4 * OUTPUT_QUEUE, "ignore_eos": True}

    async def run():
        await mgr.open(sid, long, CONTEXT + QUESTION)
        outputs = await mgr.finish(sid)
        await outputs.__anext__()
        await _until(lambda: sid not in mgr.streams)
        taken = 0
        with pytest.raises(ReaderStalled):
            async for _ in outputs:
                taken += 1
        return taken

    taken = engine._call(run())
    assert taken <= OUTPUT_QUEUE  # what was queued before the stall; nothing after
    with pytest.raises(StreamClosed, match="reader stalled"):
        engine.status(sid)
    # the engine goes on serving
    out = engine.generate(prompt=CONTEXT + QUESTION, sampling_params=GREEDY)
    assert len(out["output_ids"]) == GREEDY["max_new_tokens"]


def test_a_reader_that_leaves_aborts_the_final_turn(engine):
    mgr, sid = engine.streams, "life-leaving-reader"
    long = {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}

    async def run():
        await mgr.open(sid, long, CONTEXT + QUESTION)
        outputs = await mgr.finish(sid)
        await outputs.__anext__()
        await outputs.aclose()  # the client went away
        return sid in mgr.streams

    assert engine._call(run()) is False
    with pytest.raises(StreamClosed, match="client disconnected"):
        engine.status(sid)


@pytest.mark.parametrize(
    ("case", "params"),
    list(
        enumerate(
            [
                {"no_such_parameter": 1},
                {"stop": 5},
                {"max_new_tokens": "x"},
                {"temperature": -1},
                {"top_p": 0},
                {"n": 2},
            ]
        )
    ),
)
def test_bad_sampling_params_are_refused_at_open_and_at_finish(engine, case, params):
    sid = f"life-params-{case}"
    with pytest.raises(InvalidSamplingParams):
        engine.open_stream(sid, params, CONTEXT)
    with pytest.raises(StreamError, match="unknown stream"):
        engine.status(sid)  # nothing was opened
    engine.open_stream(sid, GREEDY, CONTEXT)
    with pytest.raises(InvalidSamplingParams):
        engine.finish(sid, QUESTION, params)
    # before any engine work: the stream is still open, and a good finish works
    assert engine._call(_state(engine, sid)) is State.OPEN
    out = engine.finish(sid, QUESTION)
    ref = engine.generate(
        prompt=CONTEXT + QUESTION, sampling_params=GREEDY, cache_salt=fresh_salt()
    )
    assert out["output_ids"] == ref["output_ids"]


async def _state(engine, sid: str) -> State:
    return engine.streams.streams[sid].state


@pytest.mark.parametrize("sid", ["a/b", "a b", "", "x" * 129, "a::b", "caf\u00e9", "a?b"])
def test_stream_ids_every_route_cannot_address_are_refused(engine, sid):
    with pytest.raises(InvalidStreamId):
        engine.open_stream(sid, GREEDY, CONTEXT)
    assert sid not in engine.streams.streams


def test_no_other_request_can_write_into_or_close_a_streams_session(engine):
    """A stream's SGLang session has an internal key, and the plugin's guards refuse any
    request but the stream's own turns that names it (before: a plain request with
    `session_params.id` = the stream id wrote into the stream, `/close_session` ended it)."""
    from sglang.srt.managers.io_struct import CloseSessionReqInput

    sid = "life-isolated"
    engine.open_stream(sid, GREEDY, CONTEXT)
    key = engine.streams.session_key(sid)
    assert key != sid and key.startswith(sid + ".")
    tm = engine.engine.tokenizer_manager
    intruder = {"text": " An intruder's words.", "sampling_params": GREEDY}
    with pytest.raises(ValueError, match="held by a stream"):
        engine._call(engine._generate(**intruder, session_params={"id": key}))
    with pytest.raises(ValueError, match="held by a stream"):
        engine._call(tm.close_session(CloseSessionReqInput(session_id=key)))
    # the stream id names no session at all: SGLang refuses such a request
    with pytest.raises(ValueError, match="does not exist"):
        engine._call(engine._generate(**intruder, session_params={"id": sid}))
    out = engine.finish(sid, QUESTION)
    ref = engine.generate(
        prompt=CONTEXT + QUESTION, sampling_params=GREEDY, cache_salt=fresh_salt()
    )
    assert out["output_ids"] == ref["output_ids"]
    assert out["meta_info"]["stream"]["reused"] > 0  # the stream's own KV served it
