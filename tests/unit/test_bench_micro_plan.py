"""bench.micro_plan's decide timing: the snapshot rebuilt before each call is the same state."""

from __future__ import annotations

import random

from bench.micro_plan import make_decide_snapshot, rebuilt, speculative_only
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


def test_the_speculative_only_mix_leaves_partial_streams_turns_whose_heads_preempt_by_swap():
    """`--speculative-only` times decide's path for a speculative head: only turns of
    partial streams wait, with a reserve, and some snapshots make the head swap victims out."""
    rng = random.Random(3)
    swapped = 0
    for _ in range(32):
        snap, streams = speculative_only(*make_decide_snapshot(rng, 200))
        assert snap.waiting and snap.spec_reserve > 0
        assert all(w.sid in streams and not streams[w.sid].complete for w in snap.waiting)
        acts = decide(rebuilt(snap), streams, get_policy("lcas"), get_preemption("swap"))
        assert all(p.mode == "swap" for p in acts.preempt)
        swapped += acts.for_speculative
    assert swapped  # the path the mix is for is taken
