"""bench.micro_plan's decide timing: the snapshot rebuilt before each call is the same state."""

from __future__ import annotations

import random

from bench.micro_plan import make_decide_snapshot, rebuilt
from s2l_sglang.sched.decide import decide
from s2l_sglang.sched.policy import get_policy, policy_names
from s2l_sglang.sched.preemption import get_preemption


def test_a_rebuilt_snapshot_is_new_objects_with_the_same_state_and_decisions():
    rng = random.Random(7)
    for _ in range(8):
        snap, streams = make_decide_snapshot(rng, 60)
        again = rebuilt(snap)
        assert again == snap
        assert all(a is not b for a, b in zip(again.waiting, snap.waiting, strict=True))
        assert all(again.slots[s] is not v for s, v in snap.slots.items())
        for name in policy_names():
            policy, preemption = get_policy(name), get_preemption("swap")
            assert decide(again, streams, policy, preemption) == decide(
                snap, streams, policy, preemption
            )
