"""Committed work never waits behind speculative work, and nobody starves, under every policy.

Runs `fairness_run.py` in its own process (see there): six streams keep three times the
prefill budget of speculative turns waiting, while plain requests and final turns arrive. The
scheduler counts, per committed request, the speculative prompt tokens SGLang admitted while it
waited: never more than one speculative chunk (the remainder of a turn SGLang had already
started chunking); and per step, the speculative tokens prefilled: never more than one chunk
either, though the step's budget holds two. Plain requests and final turns keep their arrival order under fcfs and lcas
(no newer committed work admitted ahead of an older one), every output equals the same
request's on an idle engine (float32), and the speculative streams are all prefilled in the end.
"""

from __future__ import annotations

import pytest

from tests.helpers import run_own_process

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def result() -> dict:
    return run_own_process("tests.integration.fairness_run")


@pytest.mark.parametrize("policy", ["default", "fcfs", "lcas", "mcps"])
def test_committed_work_waits_for_at_most_one_speculative_chunk(result, policy):
    got = result["policies"][policy]
    c = got["counters"]
    assert c["policy"] == policy
    assert c["committed_admitted"] >= 5, c  # 3 plain requests and 2 final turns, at least
    assert c["speculative_ahead_max"] <= result["speculative_chunk"], c
    # no step prefilled more than one chunk of speculative work, though six turns of a chunk
    # each waited and the step's budget holds two
    assert 0 < c["speculative_step_max"] <= result["speculative_chunk"], c
    assert c["admissions_capped"] > 0, c
    if policy in ("fcfs", "lcas"):  # committed work in arrival order
        assert c["newer_committed_ahead_max"] == 0, c
    assert got["plain"] == got["plain_ref"]
    assert got["final"] == got["final_ref"]
    assert got["spec_complete"]  # speculative work was not starved either
    # volatile tails went after the other speculative turns: at most one chunk of them was
    # admitted while a speculative turn waited
    assert got["held_back"] > 0, got
    assert c["volatile_ahead_max"] <= result["speculative_chunk"], c


def test_nothing_left_behind(result):
    idle = result["idle"]
    assert idle["open_sessions"] == 0 and idle["session_slots"] == 0, idle
