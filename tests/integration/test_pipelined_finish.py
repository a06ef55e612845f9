"""The pipelined finish in the real engine: a finish sends the final turn at once, built on the
stream's prefill turn in flight; the scheduler keeps it until that turn has ended and hands it
to the next step (`finals_parked`). Should that turn not finish (a stale-turn cancel that
crossed the finish), the final turn is sent back and sent again on what the session holds
(`finals_rebased`). The output is a plain request's either way (float32, greedy)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.helpers import fresh_salt
from tests.integration.test_speculative import queued_behind_plain
from tests.integration.test_streams import CONTEXT, GREEDY, QUESTION, reference

pytestmark = pytest.mark.engine

MORE = " ".join(f"fact-{k}" for k in range(400))  # ~1,200 tokens: a 512-token turn and more


def fresh_more() -> str:
    """MORE behind a new mark: text no earlier request or closed stream put in the prefix
    cache, so what a final turn prefills is all its own (`unprefilled_at_finish` leaves out
    prefix-cache hits)."""
    return f"[{fresh_salt()}] {MORE}"


async def finish_with_turn_in_flight(engine, sid: str, more: str) -> dict:
    """Open `sid`, let it prefill, append `more`, and finish once the append's first turn has
    gone to the scheduler (it is in flight at the finish). Returns the last output."""
    mgr = engine.streams
    tm = engine.engine.tokenizer_manager
    await mgr.open(sid, GREEDY, CONTEXT)
    await mgr.wait_prefilled(sid)
    await mgr.append(sid, more)
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
    more = fresh_more()
    out = engine._call(finish_with_turn_in_flight(engine, "pipe-sent", more))
    after = engine.sched_counters()
    assert after["finals_pipelined"] == before["finals_pipelined"] + 1, (before, after)
    assert after["finals_rebased"] == before["finals_rebased"]
    assert after["finals_parked_now"] == 0
    assert after["hook_errors"] == 0
    meta = out["meta_info"]["stream"]
    # the final turn carried only what the turn in flight did not: the rest of more and QUESTION
    assert 0 < meta["unprefilled_at_finish"] < len(engine.tokenizer.encode(more + QUESTION))
    assert meta["promoted"] == meta["cancelled"] == 0, meta
    assert out["output_ids"] == reference(engine, CONTEXT + more + QUESTION)["output_ids"]


async def read_final(gen, stream, meanwhile=None) -> Any:
    """Read a finish's outputs `gen`; `meanwhile(stream)` runs once the final turn is on its
    way (or has ended). Returns the last output, or the exception the reader got."""
    first = asyncio.ensure_future(anext(gen))
    if meanwhile is not None:
        while stream.pipelined_rid is None and not first.done():  # the final turn is sent
            await asyncio.sleep(0.005)
        await meanwhile(stream)
    try:
        return [await first, *[o async for o in gen]][-1]
    except Exception as exc:  # what the reader gets
        return exc


async def finish_queued(engine, sid: str, more: str = MORE, before_final=None) -> tuple[Any, bool]:
    """Open `sid` and let it prefill; append `more` while a long plain request runs, so that the
    append's turn waits in the queue; finish. `before_final(stream)` runs once the finish has
    decided to pipeline, before the final turn goes. Returns (the last output, or the
    exception the reader got; whether the turn was queued when sent)."""
    mgr = engine.streams
    await mgr.open(sid, GREEDY, CONTEXT)
    await mgr.wait_prefilled(sid)
    plain, queued = await queued_behind_plain(engine, sid, lambda: mgr.append(sid, more))
    stream = mgr.streams[sid]
    gen = await mgr.finish(sid, QUESTION)
    if before_final is not None:  # the final turn goes at the reader's first call
        assert stream.pipeline_after is not None
        before_final(stream)
    result = await read_final(gen, stream)
    await plain
    return result, queued


def test_a_queued_turn_is_merged_into_the_final_turn(engine):
    """The append's turn waits in the queue behind a long plain request (not on its session's
    slot); the final turn, built on it, does not wait for it to be admitted and prefilled: the
    scheduler cancels it and the final turn carries its tokens, as committed work
    (`finals_merged`). (Before, the final turn was parked behind it, and under memory pressure
    such a turn, a volatile tail ranked after all other work, held finals for up to 2.6 s.)"""
    before = engine.sched_counters()
    more = fresh_more()
    out, queued = engine._call(finish_queued(engine, "pipe-merge", more))
    after = engine.sched_counters()
    assert queued, "the plain request ended before the stream's turn was sent"
    assert after["finals_merged"] == before["finals_merged"] + 1, (before, after)
    assert after["finals_pipelined"] == before["finals_pipelined"] + 1, (before, after)
    assert after["finals_parked"] == before["finals_parked"], (before, after)
    assert after["turns_promoted"] == before["turns_promoted"], (before, after)
    assert after["hook_errors"] == 0
    meta = out["meta_info"]["stream"]
    n_more = len(engine.tokenizer.encode(more, add_special_tokens=False))
    assert meta["promoted"] > 0 and meta["cancelled"] == 0, meta
    # none of `more` was prefilled when the final chunk came: the queued turn's part neither
    assert meta["unprefilled_at_finish"] >= n_more - 2, (meta, n_more)
    assert out["output_ids"] == reference(engine, CONTEXT + more + QUESTION)["output_ids"]


def merged_once(engine, finish: Any, why: str) -> dict:
    """Run coroutine `finish` (it finishes one stream with its turn queued; returns the last
    output and whether the turn was queued as the test needs, else fails with `why`), and
    check that the final turn was merged with that turn, no hook failing."""
    before = engine.sched_counters()
    out, queued = engine._call(finish)
    after = engine.sched_counters()
    assert queued, why
    assert after["finals_merged"] == before["finals_merged"] + 1, (before, after)
    assert after["hook_errors"] == 0
    return out


def test_a_stream_whose_first_turn_is_queued_is_finished_with_it_merged(engine):
    """The stream opens while a long plain request runs, so its first turn waits in the queue
    and its session has no finished turn; the finish merges that turn into the final turn,
    which becomes the session's first request (SGLang takes its ids as they are: they must
    keep SGLang's array type, or its next step fails)."""
    mgr = engine.streams

    async def run() -> tuple[dict, bool]:
        plain, queued = await queued_behind_plain(
            engine, "pipe-merge-first", lambda: mgr.open("pipe-merge-first", GREEDY, CONTEXT)
        )
        outs = [o async for o in await mgr.finish("pipe-merge-first", QUESTION)]
        await plain
        return outs[-1], queued

    out = merged_once(engine, run(), "the plain request ended before the stream's turn was sent")
    assert out["output_ids"] == reference(engine, CONTEXT + QUESTION)["output_ids"]
    assert reference(engine, CONTEXT)["output_ids"]  # the engine serves on


def test_a_merged_final_turn_rolls_back_what_the_final_context_rewrote(engine):
    """Update mode: the update's turn (a rollback, then the new tail) waits in the queue; a
    last update rewrites the end of that turn's tokens (too few for a stale-turn cancel), and
    the finish is built on the queued turn. Merged, the final turn keeps what the session held
    before that turn, appends the part of the turn the final context keeps, then its own: the
    prompt is the final text's, and the output a plain request's."""
    mgr = engine.streams
    v1 = "Notes. " + " ".join(f"fact-{k}" for k in range(80))
    v2 = v1[:200] + " ".join(f"revised-{k}" for k in range(60))  # a rollback, then a tail
    v3 = v2[: v2.rindex(" revised-56")] + " and so on."  # rewrites a few of v2's last tokens

    async def run() -> tuple[dict, bool]:
        await mgr.open("pipe-merge-update", GREEDY, v1)
        await mgr.wait_prefilled("pipe-merge-update")
        plain, queued = await queued_behind_plain(
            engine, "pipe-merge-update", lambda: mgr.update("pipe-merge-update", v2)
        )
        stream = mgr.streams["pipe-merge-update"]
        await mgr.update("pipe-merge-update", v3)
        cancelled = stream.cancelled_rid  # a stale-turn cancel would end the test's point
        outs = [o async for o in await mgr.finish("pipe-merge-update", QUESTION)]
        await plain
        return outs[-1], queued and cancelled is None

    out = merged_once(engine, run(), "the update's turn was not queued, or was cancelled as stale")
    meta = out["meta_info"]["stream"]
    assert meta["promoted"] > 0 and meta["invalidated"] > 0, meta
    assert out["output_ids"] == reference(engine, v3 + QUESTION)["output_ids"]


def test_a_final_turn_whose_turn_before_is_cancelled_is_sent_again(engine):
    """A stale-turn cancel for the turn in flight crosses the finish (it reaches the scheduler
    after the finish decided to pipeline, before the final turn built on that turn): the
    queued turn is cancelled, and the final turn is sent back and sent again on what the
    session holds."""
    mgr = engine.streams

    def cancel(stream) -> None:  # dispatched before the final turn (asyncio runs in order)
        mgr._cancel(stream, stream.inflight_rid, for_final=False)

    before = engine.sched_counters()
    out, queued = engine._call(finish_queued(engine, "pipe-rebase", before_final=cancel))
    after = engine.sched_counters()
    assert queued, "the plain request ended before the stream's turn was sent"
    assert after["finals_rebased"] == before["finals_rebased"] + 1, (before, after)
    assert after["turns_cancelled"] == before["turns_cancelled"] + 1, (before, after)
    assert after["hook_errors"] == 0
    meta = out["meta_info"]["stream"]
    assert meta["cancelled"] > 0, meta
    assert out["output_ids"] == reference(engine, CONTEXT + MORE + QUESTION)["output_ids"]


#: ~4,500 tokens: one turn of them takes several of the engine's 1,024-token prefill steps
MANY = " ".join(f"item-{k}" for k in range(1500))


def many(sid: str) -> str:
    """MANY, new to the prefix cache for each stream (cached, it would take no time)."""
    return f"List {sid}: {MANY}"


async def finish_mid_prefill(engine, sid: str, meanwhile=None) -> Any:
    """Open `sid` and let it prefill; append MANY as one turn (the manager's turn size raised
    for this call) and finish once that turn has left the queue, SGLang prefilling it in
    chunks: the final turn arrives while it runs, so it can neither be merged nor handed over,
    and is parked. `meanwhile(stream)` runs once the final turn is on its way. Returns the
    last output, or the exception the reader got."""
    from s2l_sglang.stream.manager import sched_counters_from

    mgr = engine.streams
    tm = engine.engine.tokenizer_manager
    await mgr.open(sid, GREEDY, CONTEXT)
    await mgr.wait_prefilled(sid)
    config = mgr.config
    mgr.config = config.replace(speculative_chunk=8192)
    try:
        await mgr.append(sid, many(sid))
        stream = mgr.streams[sid]
        while stream.inflight_rid not in tm.rid_to_state:  # the turn is sent
            await asyncio.sleep(0.005)
        while True:  # the scheduler answers between steps: a step of the turn has run
            counters = sched_counters_from(await tm.get_internal_state())
            if sid not in counters["waiting_streams"]:
                break
    finally:
        mgr.config = config
    return await read_final(await mgr.finish(sid, QUESTION), stream, meanwhile)


def test_a_final_turn_is_parked_behind_a_turn_mid_prefill(engine):
    """The turn the final turn is built on is mid-prefill when the final turn arrives: the
    scheduler keeps the final turn (`finals_parked`) and hands it to the first step after
    that turn ends; the output is a plain request's."""
    before = engine.sched_counters()
    out = engine._call(finish_mid_prefill(engine, "pipe-park"))
    after = engine.sched_counters()
    assert after["finals_parked"] == before["finals_parked"] + 1, (before, after)
    assert after["finals_merged"] == before["finals_merged"], (before, after)
    assert after["finals_parked_now"] == 0 and after["hook_errors"] == 0, after
    meta = out["meta_info"]["stream"]
    assert meta["promoted"] == meta["cancelled"] == 0, meta
    assert (
        out["output_ids"] == reference(engine, CONTEXT + many("pipe-park") + QUESTION)["output_ids"]
    )


def test_an_abort_reaches_a_parked_final_turn(engine):
    """Aborting the stream while its final turn is parked: the final turn ends (an error for
    the reader), the session closes and its KV is freed; the engine serves on."""
    mgr = engine.streams

    async def abort(stream) -> None:
        await mgr.abort(stream.sid, "test")

    before = engine.sched_counters()
    result = engine._call(finish_mid_prefill(engine, "pipe-abort", abort))
    assert isinstance(result, Exception), result
    assert engine._call(mgr.wait_closed("pipe-abort")).startswith("aborted")
    after = engine.sched_counters()
    assert after["finals_parked"] == before["finals_parked"] + 1, (before, after)
    assert after["finals_parked_now"] == 0 and after["hook_errors"] == 0, after
    assert reference(engine, CONTEXT)["output_ids"]  # the engine serves on
