"""Update mode's hold-back, over the fake tokenizer manager of test_chat_stream (no engine):
after an update, the prefix the new version shares with the one before goes at speculative
priority, and the rewritten tail as volatile turns (rid.is_volatile), which the scheduler orders
after all other work. The order itself is tested on the real scheduler in
tests/integration/test_speculative.py."""

from __future__ import annotations

import asyncio

from s2l_sglang.config import StreamConfig
from s2l_sglang.rid import is_volatile, stream_of
from tests.unit.test_chat_stream import FakeTM


def turns_of(hold_back: bool, versions: list[list[int]]) -> list:
    from s2l_sglang.stream.manager import StreamManager

    tm = FakeTM()
    mgr = StreamManager(tm, StreamConfig(hold_back=hold_back, speculative_chunk=8))

    async def run():
        await mgr.open("h", None, input_ids=versions[0])
        await mgr.wait_prefilled("h")
        for version in versions[1:]:
            await mgr.update("h", input_ids=version)
            await mgr.wait_prefilled("h")
        await mgr.abort("h")

    asyncio.run(run())
    return tm.turns


V1 = list(range(10, 30))  # 20 ids
V2 = V1[:6] + list(range(100, 114))  # shares 6 with V1, rewrites 14
V3 = V2[:16] + list(range(200, 204))  # shares 16 with V2


def test_the_rewritten_tail_goes_as_volatile_turns():
    turns = turns_of(True, [V1, V2, V3])
    kinds = [(is_volatile(t.rid), len(t.input_ids)) for t in turns]
    # V1: plain speculative turns of <= 8; V2: rolls back to 6, all 14 new ids are volatile;
    # V3: rolls back to 16 of V2 (kept), its 4 new ids are volatile again
    assert kinds == [(False, 8), (False, 8), (False, 4), (True, 8), (True, 6), (True, 4)], kinds
    assert all(stream_of(t.rid) == stream_of(turns[0].rid) for t in turns)


def test_a_stable_part_not_yet_held_goes_first_at_speculative_priority():
    # V2's volatile tail never reached the engine (a version later shares most of it):
    # V3 = V2[:16] + 4 new. From what is held after V1 -> (V2 rolled back to 6), ids 6..16
    # are stable (shared by V2 and V3) and go as a speculative turn, the rest as volatile.
    from s2l_sglang.stream.manager import StreamManager

    tm = FakeTM()
    mgr = StreamManager(tm, StreamConfig(hold_back=True, speculative_chunk=64))

    async def run():
        await mgr.open("h", None, input_ids=V1)
        await mgr.wait_prefilled("h")
        stream = mgr.streams["h"]
        stream.held = V2[:6]  # as if V2's volatile turn was cancelled after its rollback
        stream.ids, stream.volatile_from = list(V2), 6
        await mgr.update("h", input_ids=V3)
        await mgr.wait_prefilled("h")
        await mgr.abort("h")

    asyncio.run(run())
    last = [(is_volatile(t.rid), list(t.input_ids)) for t in tm.turns[-2:]]
    assert last == [(False, V3[6:16]), (True, V3[16:])], last


def test_without_hold_back_every_prefill_turn_is_speculative():
    turns = turns_of(False, [V1, V2, V3])
    assert not any(is_volatile(t.rid) for t in turns)
    assert [len(t.input_ids) for t in turns] == [8, 8, 4, 8, 6, 4]


async def _settling(stream) -> None:
    """Until the stream's pump waits for the stream to settle (it clears `moved` to wait);
    an AssertionError if it does not within 10 s."""
    for _ in range(10_000):
        if not stream.moved.is_set():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the pump did not wait for the stream to settle")


def test_a_tail_waits_while_versions_come_in_a_burst_and_a_finish_ends_the_wait():
    """Versions 10 s apart so far: a new tail waits until the stream has been quiet for 20 s.
    A refinement meanwhile rewrites it: nothing of it was sent. The finish wakes the pump at
    once, and the final turn carries the new tail."""
    from s2l_sglang.stream.manager import StreamManager

    tm = FakeTM()
    mgr = StreamManager(tm, StreamConfig(hold_back=True, hold_back_settle=30.0,
                                         speculative_chunk=64))  # fmt: skip

    async def run():
        await mgr.open("h", {"max_new_tokens": 1}, input_ids=V1)
        await mgr.wait_prefilled("h")
        stream = mgr.streams["h"]
        stream.update_gap = 10.0  # as if the versions so far came 10 s apart
        await mgr.update("h", input_ids=V2)
        await _settling(stream)
        assert not stream.pump.done() and len(tm.turns) == 1  # V1's turn only
        await mgr.update("h", input_ids=V3)
        await _settling(stream)
        outs = await asyncio.wait_for(_drain(await mgr.finish("h")), 10)  # not 20 s
        return outs

    asyncio.run(run())
    # V1; then the part V2 and V3 share (stable: not held back), after the rollback to 6;
    # then the final turn with V3's new tail: no volatile turn was ever sent
    assert not any(is_volatile(t.rid) for t in tm.turns)
    stable, final = tm.turns[1:]
    assert list(stable.input_ids) == V3[6:16] and stable.session_params["offset"] == 6
    assert list(final.input_ids) == V3[16:]


async def _drain(outputs) -> list:
    return [o async for o in outputs]


def test_a_tail_goes_once_the_stream_is_quiet():
    from s2l_sglang.stream.manager import StreamManager

    tm = FakeTM()
    mgr = StreamManager(tm, StreamConfig(hold_back=True, hold_back_settle=0.05,
                                         speculative_chunk=64))  # fmt: skip

    async def run():
        await mgr.open("h", None, input_ids=V1)
        await mgr.wait_prefilled("h")
        mgr.streams["h"].update_gap = 10.0  # capped: quiet for 0.05 s
        await mgr.update("h", input_ids=V2)
        await mgr.wait_prefilled("h")
        await mgr.abort("h")

    asyncio.run(run())
    assert [(is_volatile(t.rid), list(t.input_ids)) for t in tm.turns[1:]] == [(True, V2[6:])]


def test_the_settle_time_is_checked():
    import pytest

    with pytest.raises(ValueError, match="hold_back_settle"):
        StreamConfig(hold_back_settle=-1)
