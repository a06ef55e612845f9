"""What the benchmark records of the scheduler per replay (`execute.replay_sched`), and the
start-again of the maxima that makes them the replay's own (`StreamScheduling.set_policy`)."""

from __future__ import annotations

from bench.harness.execute import replay_sched
from s2l_sglang.scheduling import MAXIMA, StreamScheduling


def test_a_replay_records_its_counts_as_increases_and_maxima_and_states_as_they_end():
    before = {"committed_admitted": 100, "turns_cancelled": 7, "speculative_ahead_max": 477,
              "spec_reserve": 512, "kv_available": 60_000, "policy": "fcfs"}  # fmt: skip
    after = {"committed_admitted": 200, "turns_cancelled": 9, "speculative_ahead_max": 300,
             "spec_reserve": 1_100, "kv_available": 23_000, "policy": "fcfs"}  # fmt: skip
    assert replay_sched(before, after) == {
        "committed_admitted": 100,  # counts: what the replay added
        "turns_cancelled": 2,
        "speculative_ahead_max": 300,  # a maximum: its value (a difference would be -177)
        "spec_reserve": 1_100,  # states at one moment: their value after the replay
        "kv_available": 23_000,
    }
    assert replay_sched(None, after) is None


def test_setting_the_policy_starts_every_maximum_again_and_keeps_the_counts():
    sched = StreamScheduling()
    assert set(MAXIMA) >= {"speculative_ahead_max", "stalled_steps_max", "volatile_ahead_max"}
    for key in MAXIMA:
        setattr(sched.counters, key, 99)
    sched.counters.turns_cancelled = 5
    sched.set_policy(sched.policy_name)  # the policy in force: what the benchmark does
    counters = sched.export()
    assert all(counters[key] == 0 for key in MAXIMA), counters
    assert counters["turns_cancelled"] == 5


def test_publication_switches_at_run_time_and_nothing_else_changes():
    sched = StreamScheduling()
    sched.set_policy("lcas")
    sched.counters.streams_published = 3
    assert sched.export()["publish_at_close"] is True
    sched.set_publish_at_close(False)
    counters = sched.export()
    assert counters["publish_at_close"] is False and sched.config.publish_at_close is False
    assert counters["policy"] == "lcas" and counters["streams_published"] == 3
    sched.set_publish_at_close(True)
    assert sched.export()["publish_at_close"] is True
