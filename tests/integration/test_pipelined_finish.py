"""The pipelined finish in the real engine: a finish sends the final turn at once, built on the
stream's prefill turn in flight; the scheduler keeps it until that turn has ended and hands it
to the next step (`finals_parked`). Should that turn not finish (a stale-turn cancel that
crossed the finish), the final turn is sent back and sent again on what the session holds
(`finals_rebased`). The output is a plain request's either way (float32, greedy)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.integration.test_speculative import queued_behind_plain
from tests.integration.test_streams import CONTEXT, GREEDY, QUESTION, reference

pytestmark = pytest.mark.engine

MORE = " ".join(f"fact-{k}" for k in range(400))  # ~1,200 tokens: a 512-token turn and more


async def finish_with_turn_in_flight(engine, sid: str) -> dict:
    """Open `sid`, let it prefill, append MORE, and finish once the append's first turn has
    gone to the scheduler (it is in flight at the finish). Returns the last output."""
    mgr = engine.streams
    tm = engine.engine.tokenizer_manager
    await mgr.open(sid, GREEDY, CONTEXT)
    await mgr.wait_prefilled(sid)
    await mgr.append(sid, MORE)
    stream = mgr.streams[sid]
    while stream.inflight_rid not in tm.rid_to_state:  # the append's turn is sent
        await asyncio.sleep(0.005)
    inflight = stream.inflight_rid
    outputs = await mgr.finish(sid, QUESTION)
    assert stream.pipeline_after == inflight  # the finish is pipelined on that turn
    return [out async for out in outputs][-1]


def test_the_final_turn_is_sent_built_on_the_turn_in_flight(engine):
    """The final turn goes without waiting for the turn in flight, carrying only what that turn
    does not; SGLang ingests it between steps, so it finds that turn ended, in most cases."""
    before = engine.sched_counters()
    out = engine._call(finish_with_turn_in_flight(engine, "pipe-park"))
    after = engine.sched_counters()
    assert after["finals_pipelined"] == before["finals_pipelined"] + 1, (before, after)
    assert after["finals_rebased"] == before["finals_rebased"]
    assert after["finals_parked_now"] == 0
    assert after["hook_errors"] == 0
    meta = out["meta_info"]["stream"]
    # the final turn carried only what the turn in flight did not: the rest of MORE and QUESTION
    assert 0 < meta["unprefilled_at_finish"] < len(engine.tokenizer.encode(MORE + QUESTION))
    assert meta["promoted"] == meta["cancelled"] == 0, meta
    assert out["output_ids"] == reference(engine, CONTEXT + MORE + QUESTION)["output_ids"]


async def finish_queued(engine, sid: str, meanwhile=None) -> tuple[Any, bool]:
    """Open `sid` and let it prefill; append MORE while a long plain request runs, so that the
    append's turn waits in the queue; finish. `meanwhile(stream)` runs once the final turn is
    on its way. Returns (the last output, or the exception the reader got; whether the turn
    was queued when sent)."""
    mgr = engine.streams
    await mgr.open(sid, GREEDY, CONTEXT)
    await mgr.wait_prefilled(sid)
    plain, queued = await queued_behind_plain(engine, sid, lambda: mgr.append(sid, MORE))
    stream = mgr.streams[sid]
    gen = await mgr.finish(sid, QUESTION)
    first = asyncio.ensure_future(anext(gen))
    if meanwhile is not None:
        while stream.pipelined_rid is None:  # the final turn is on its way
            await asyncio.sleep(0.005)
        await meanwhile(stream)
    try:
        last = [await first] + [o async for o in gen]
        result: Any = last[-1]
    except Exception as exc:  # what the reader gets
        result = exc
    await plain
    return result, queued


def test_a_queued_turn_is_promoted_and_the_final_turn_parked_behind_it(engine):
    """The append's turn waits in the queue behind a long plain request; the finish parks the
    final turn behind it, and the scheduler ranks that turn as committed work from then on."""
    before = engine.sched_counters()
    out, queued = engine._call(finish_queued(engine, "pipe-promote"))
    after = engine.sched_counters()
    assert queued, "the plain request ended before the stream's turn was sent"
    assert after["finals_parked"] == before["finals_parked"] + 1, (before, after)
    assert after["finals_pipelined"] == before["finals_pipelined"] + 1, (before, after)
    assert after["turns_promoted"] == before["turns_promoted"] + 1, (before, after)
    assert after["hook_errors"] == 0
    assert out["output_ids"] == reference(engine, CONTEXT + MORE + QUESTION)["output_ids"]


def test_a_final_turn_whose_turn_before_is_cancelled_is_sent_again(engine):
    """A stale-turn cancel for the turn in flight crosses the finish (sent after the final
    turn, as one sent just before the finish could arrive): the queued turn is cancelled, the
    parked final turn is sent back and sent again on what the session holds."""
    mgr = engine.streams

    async def cancel(stream) -> None:
        mgr._cancel(stream, stream.inflight_rid, for_final=False)

    before = engine.sched_counters()
    out, queued = engine._call(finish_queued(engine, "pipe-rebase", cancel))
    after = engine.sched_counters()
    assert queued, "the plain request ended before the stream's turn was sent"
    assert after["finals_rebased"] == before["finals_rebased"] + 1, (before, after)
    assert after["turns_cancelled"] == before["turns_cancelled"] + 1, (before, after)
    assert after["hook_errors"] == 0
    meta = out["meta_info"]["stream"]
    assert meta["cancelled"] > 0, meta
    assert out["output_ids"] == reference(engine, CONTEXT + MORE + QUESTION)["output_ids"]


def test_an_abort_reaches_a_parked_final_turn(engine):
    """Aborting the stream while its final turn is parked: the final turn ends (an error for
    the reader), the session closes and its KV is freed; the engine serves on."""
    mgr = engine.streams

    async def abort(stream) -> None:
        await mgr.abort(stream.sid, "test")

    result, queued = engine._call(finish_queued(engine, "pipe-abort", abort))
    assert queued, "the plain request ended before the stream's turn was sent"
    assert isinstance(result, Exception), result
    assert engine._call(mgr.wait_closed("pipe-abort")).startswith("aborted")
    after = engine.sched_counters()
    assert after["finals_parked_now"] == 0 and after["hook_errors"] == 0, after
    assert reference(engine, CONTEXT)["output_ids"]  # the engine serves on
