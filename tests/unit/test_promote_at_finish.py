"""The finish's message about its stream's prefill turn in flight (`StreamManager.
_promote_inflight`), on a fake tokenizer manager (`FakeTM`, a named fake: no engine runs
here; the scheduler side is tests/unit/test_decide.py and tests/integration/
test_speculative.py). The message asks the scheduler to cancel the turn, or to promote it to
committed work when it waits on its session's KV."""

from __future__ import annotations

import asyncio

from s2l_sglang.messages import CancelStaleTurnReq
from s2l_sglang.rid import final_rid, turn_rid
from tests.unit.test_chat_stream import FakeTM


def sent_at_finish(inflight: str, cancelled: str | None, for_final: bool) -> tuple[list, bool]:
    """The messages `_promote_inflight` sends for a stream whose turn `inflight` is in flight
    and that was last sent a cancel for `cancelled` (a stale-turn one unless `for_final`);
    and the stream's `cancel_for_final` after."""
    from s2l_sglang.stream.manager import StreamManager

    async def run():
        tm = FakeTM()
        mgr = StreamManager(tm)
        await mgr.open("s", input_ids=[5, 6, 7])
        stream = mgr.streams["s"]
        if stream.pump is not None:
            await stream.pump
        rid = inflight.format(key=stream.key)
        stream.inflight_rid = rid
        stream.cancelled_rid = cancelled.format(key=stream.key) if cancelled else None
        stream.cancel_for_final = for_final
        mgr._promote_inflight(stream)
        await asyncio.gather(*mgr._tasks)
        return tm.sent, stream.cancel_for_final, rid

    sent, flag, rid = asyncio.run(run())
    assert all(isinstance(m, CancelStaleTurnReq) and m.rid == rid for m in sent)
    return [m.finishing for m in sent], flag


TURN = turn_rid("{key}", 3)


def test_a_queued_turn_is_asked_to_cancel_or_promote_at_the_finish():
    assert sent_at_finish(TURN, None, False) == ([True], True)


def test_a_turn_sent_a_stale_turn_cancel_gets_the_finishing_message_too():
    """The stale-turn cancel may have found the turn on its session's KV (not cancellable):
    without a second message, the final turn would wait for it at speculative priority."""
    assert sent_at_finish(TURN, TURN, False) == ([True], False)  # its counters stay stale


def test_nothing_more_is_sent_for_a_turn_already_asked_at_the_finish_or_a_final_turn():
    assert sent_at_finish(TURN, TURN, True) == ([], True)
    assert sent_at_finish(final_rid("{key}"), None, False) == ([], False)
