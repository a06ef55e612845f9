"""A final turn kept by `StreamScheduling.park_final` (the pipelined finish) arrives when it is
kept: SGLang creating it at its release is not a second arrival. The park itself needs a real
engine (tests/integration/test_pipelined_finish.py); this checks the record it leaves, with
SGLang's clock (`adapter.now`) set by the test."""

from __future__ import annotations

import pytest

from s2l_sglang import adapter
from s2l_sglang.rid import final_rid, turn_rid
from s2l_sglang.scheduling import StreamScheduling


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [10.0]
    monkeypatch.setattr(adapter, "now", lambda: now[0])
    return now


def test_a_kept_final_ranks_from_its_arrival_not_its_release(clock):
    sched = StreamScheduling()
    sched.on_turn(turn_rid("s", 1))  # the stream opens at 10
    clock[0] = 12.0
    sched.record_kept(final_rid("s"))  # the finish, kept behind the turn in flight
    assert sched.streams["s"].complete and sched.streams["s"].last_chunk == 12.0
    clock[0] = 13.5
    sched.on_turn(final_rid("s"))  # SGLang creates it at its release
    assert sched.streams["s"].last_chunk == 12.0  # lcas ranks it by its finish
    assert sched.streams["s"].opened == 10.0
    assert not sched.recorded_kept
    clock[0] = 20.0  # a stream kept open: its next turns are recorded as they come
    sched.on_turn(turn_rid("s", 2))
    assert sched.streams["s"].last_chunk == 20.0 and not sched.streams["s"].complete
    sched.on_turn(final_rid("s", 1))
    assert sched.streams["s"].complete


def test_a_kept_final_that_sglang_rejects_leaves_no_record(clock):
    """Handed over at its release but never created by SGLang (rejected before its session
    took it): `on_turn` does not come, and `handed_over` drops the record."""
    sched = StreamScheduling()
    sched.on_turn(turn_rid("s", 1))
    sched.record_kept(final_rid("s"))
    assert sched.recorded_kept == {final_rid("s")}
    sched.handed_over(final_rid("s"))
    assert not sched.recorded_kept
    sched.on_turn(final_rid("s"))  # created after all: recorded as an arrival, nothing kept
    assert not sched.recorded_kept and sched.streams["s"].complete
