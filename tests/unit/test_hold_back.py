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
