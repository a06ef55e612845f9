"""Speculative work in the real engine: prefill turns of a context not yet final are capped at
`speculative_chunk` tokens, and a turn that a newer context makes stale is cancelled, with the
final output unchanged (float32, greedy, against a plain request)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.integration.test_streams import CONTEXT, GREEDY, QUESTION, reference

pytestmark = pytest.mark.engine


def test_speculative_turns_carry_at_most_one_chunk(engine):
    mgr = engine.streams
    cap = mgr.config.speculative_chunk
    text = CONTEXT * 12  # ~1,200 tokens: three speculative turns of <= 512 tokens
    engine.open_stream("spec-cap", GREEDY, text)
    status = engine._call(mgr.wait_prefilled("spec-cap"))
    assert status["held_tokens"] == status["context_tokens"] > 2 * cap
    assert status["turns"] == -(-status["context_tokens"] // cap)  # ceil: capped turns
    assert status["speculative"] == status["prefilled"] > 0
    out = engine.finish("spec-cap", QUESTION)
    assert out["output_ids"] == reference(engine, text + QUESTION)["output_ids"]
    final = out["meta_info"]["stream"]
    assert final["speculative"] < final["prefilled"]  # the final turn is committed work


LONG_PROMPT = "Background: " + CONTEXT * 30  # ~3,000 tokens, seconds of prefill
_plain_calls = itertools.count()


async def queued_behind_plain(engine, sid: str, change) -> tuple[asyncio.Future, bool]:
    """Start a long plain request, then `change()` stream `sid` (an update or an append) once
    the plain request is in; returns the plain request's future and whether it still ran
    when the stream's turn for the change was sent (then that turn queued behind it)."""
    # A new first line each call: a prompt the prefix cache holds would take no time at all.
    text = f"Request {next(_plain_calls)}. {LONG_PROMPT}"
    plain = asyncio.ensure_future(
        engine._generate(text=text, sampling_params={"max_new_tokens": 1})
    )
    tm = engine.engine.tokenizer_manager
    while not tm.rid_to_state:  # the plain request is in
        await asyncio.sleep(0.01)
    await change()
    stream = engine.streams.streams[sid]
    while stream.inflight_rid not in tm.rid_to_state:  # the change's turn is sent
        await asyncio.sleep(0.01)
    return plain, not plain.done()


def test_a_stale_turn_is_cancelled_and_the_output_is_unchanged(engine):
    """An update's turn (it rolls the session back) waits in the queue behind a long plain
    request; a newer update that drops that turn's tokens arrives meanwhile: the queued turn is
    aborted, not run, and the stream goes on from what the session holds after the rollback."""
    mgr = engine.streams
    v1 = "Notes. " + " ".join(f"fact-{k}" for k in range(80))
    v2 = v1[:120] + " ".join(f"revised-{k}" for k in range(40))  # keeps a prefix of v1
    v3 = v1 + CONTEXT  # shares all of v1 again: more than v2's turn keeps

    async def run() -> tuple[dict, dict, bool]:
        await mgr.open("spec-cancel", GREEDY, v1)
        await mgr.wait_prefilled("spec-cancel")
        plain, queued = await queued_behind_plain(
            engine, "spec-cancel", lambda: mgr.update("spec-cancel", v2)
        )
        await mgr.update("spec-cancel", v3)
        status = await mgr.wait_prefilled("spec-cancel")
        outs = [o async for o in await mgr.finish("spec-cancel", QUESTION)]
        await plain
        return status, outs[-1], queued

    status, out, queued = engine._call(run())
    assert queued, "the plain request ended before the stream's turn was sent"
    assert status["cancelled"] > 0, status  # v2's turn was aborted, not finished
    assert out["output_ids"] == reference(engine, v3 + QUESTION)["output_ids"]
    # the rollbacks, the cancellation and the ordering ran through the adapter without a
    # hook falling back to SGLang's own behaviour
    assert engine.sched_counters()["hook_errors"] == 0


def test_a_finish_does_not_wait_behind_its_own_queued_prefill_turn(engine):
    """A stream's prefill turn waits in the queue behind a long plain request (speculative
    work goes after committed work); the stream finishes meanwhile. Without the pipelined
    finish (test_pipelined_finish.py has it), the queued turn is cancelled and the final turn,
    committed work, carries its tokens (`promoted`); before, the final turn waited for that
    turn, ordered after every committed request."""
    mgr = engine.streams
    config = mgr.config
    mgr.config = config.replace(pipelined_finish=False)  # decided by the manager alone
    more = " ".join(f"fact-{k}" for k in range(120))

    async def run() -> tuple[dict, bool]:
        await mgr.open("spec-promote", GREEDY, CONTEXT)
        await mgr.wait_prefilled("spec-promote")
        plain, queued = await queued_behind_plain(
            engine, "spec-promote", lambda: mgr.append("spec-promote", more)
        )
        outs = [o async for o in await mgr.finish("spec-promote", QUESTION)]
        await plain
        return outs[-1], queued

    try:
        out, queued = engine._call(run())
    finally:
        mgr.config = config
    assert queued, "the plain request ended before the stream's turn was sent"
    counters = out["meta_info"]["stream"]
    assert counters["promoted"] > 0 and counters["cancelled"] == 0, counters
    assert out["output_ids"] == reference(engine, CONTEXT + more + QUESTION)["output_ids"]
