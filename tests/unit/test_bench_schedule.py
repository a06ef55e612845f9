"""The run's order: interleaved, seeded blocks of replays; one engine with policy switching or
one per policy; where the lower-bound samples go; which probes are flagged as drift."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.harness.presets import Preset, WorkloadSpec
from bench.harness.schedule import (
    bound_slots,
    drift,
    interleave,
    plan_per_policy,
    plan_single,
    replays_of,
)

TRACE_MODES = {"crawler": "append", "ann": "update"}


def preset(**kw) -> Preset:
    fields = dict(
        name="x",
        description="",
        workloads=(WorkloadSpec("crawler", (0.5, 1.0), 4), WorkloadSpec("ann", (1.0,), 4)),
        policies=("default", "fcfs"),
    )
    fields.update(kw)
    return Preset(**fields)


def keys(replays):
    return [(r.workload, r.rate, r.label) for r in replays]


def test_replays_cover_every_mode_that_applies_and_stream_once_per_policy():
    labels = Counter(r.label for r in replays_of(preset(), TRACE_MODES))
    # crawler: 2 rates x (wait, warming, sessions, 2 streams); ann: 1 rate x (no sessions)
    assert labels == {"wait": 3, "warming": 3, "sessions": 2, "stream-default": 3,
                      "stream-fcfs": 3}  # fmt: skip
    only = replays_of(preset(workloads=(WorkloadSpec("ann", (1.0,), 4, modes=("wait",)),)), {})
    assert [r.label for r in only] == ["wait"]


def test_stream_nopub_runs_once_per_policy_with_publication_off():
    modes = ("wait", "stream", "stream-nopub")
    replays = replays_of(preset(modes=modes), TRACE_MODES)
    labels = Counter(r.label for r in replays)
    assert labels["stream-nopub-fcfs"] == labels["stream-nopub-default"] == 3
    publish = {r.label: r.mode.publish_at_close for r in replays}
    assert publish["stream-nopub-fcfs"] is False
    assert publish["stream-fcfs"] is publish["wait"] is None  # the engine's own setting
    assert {r.policy for r in replays if r.label == "stream-nopub-fcfs"} == {"fcfs"}
    # without run-time policy switching, each later engine runs both stream modes
    plans = plan_per_policy(preset(modes=modes), TRACE_MODES)
    assert Counter(r.label for r in plans[1].replays) == {"stream-fcfs": 3, "stream-nopub-fcfs": 3}


def test_interleave_shuffles_each_repeat_block_with_a_seed():
    base = replays_of(preset(), TRACE_MODES)
    order = interleave(base, repeats=3, seed=7)
    assert len(order) == 3 * len(base)
    blocks = [order[i * len(base) : (i + 1) * len(base)] for i in range(3)]
    for r, block in enumerate(blocks):
        assert sorted(keys(block)) == sorted(keys(base))  # every replay once per block
        assert {rp.repeat for rp in block} == {r}
    assert keys(blocks[0]) != keys(blocks[1])  # each block in its own order
    assert keys(interleave(base, 3, 7)) == keys(order)  # seeded
    assert keys(interleave(base, 3, 8)) != keys(order)
    assert keys(order[: len(base)]) != keys(base)  # not the plain nested-loop order


def test_single_engine_plan_interleaves_every_mode_and_policy():
    (plan,) = plan_single(preset(repeats=2), TRACE_MODES)
    assert len(plan.replays) == 2 * 14 and {r.engine for r in plan.replays} == {0}
    policies = {r.label: r.policy for r in plan.replays}
    assert policies["stream-fcfs"] == "fcfs" and policies["stream-default"] == "default"
    assert policies["wait"] == policies["warming"] == "default"  # SGLang's own order
    assert plan.policy == plan.replays[0].policy


def test_fallback_starts_one_engine_per_policy():
    plans = plan_per_policy(preset(), TRACE_MODES)
    assert [p.policy for p in plans] == ["default", "fcfs"]
    assert Counter(r.label for r in plans[1].replays) == {"stream-fcfs": 3}
    first = Counter(r.label for r in plans[0].replays)
    assert first["wait"] == 3 and "stream-fcfs" not in first
    assert {r.engine for r in plans[1].replays} == {1}
    no_stream = plan_per_policy(preset(modes=("wait", "warming")), TRACE_MODES)
    assert len(no_stream) == 1


@pytest.mark.parametrize("n,replays", [(5, 3), (7, 8), (100, 12), (4, 4)])
def test_bound_samples_of_a_query_fall_before_different_replays(n, replays):
    slots = bound_slots(n, replays, samples=3)
    assert len(slots) == replays
    where: dict[int, list[int]] = {}
    for j, passes in enumerate(slots):
        for p in passes:
            assert len(set(p)) == len(p)  # a query once per pass (the cache is flushed between)
            for q in p:
                where.setdefault(q, []).append(j)
    assert sorted(where) == list(range(n))
    assert all(len(js) == 3 and len(set(js)) == 3 for js in where.values())
    sizes = [sum(len(p) for p in passes) for passes in slots]
    assert max(sizes) - min(sizes) <= 1  # spread evenly over the replays


def test_bound_samples_with_fewer_replays_than_samples_take_several_passes():
    (only,) = bound_slots(4, 1, samples=3)
    assert only == [[0, 1, 2, 3]] * 3
    two = bound_slots(4, 2, samples=3)
    assert sum(len(p) for p in two[0]) == sum(len(p) for p in two[1]) == 6
    assert all(Counter(q for passes in two for p in passes for q in p)[q] == 3 for q in range(4))
    assert bound_slots(0, 3) == [[], [], []]


def test_drift_flags_probes_far_from_the_median():
    median, flags = drift([1.0, 1.1, 0.9, 1.3, 0.7, None], margin=0.25)
    assert median == pytest.approx(1.0)
    assert [f["flagged"] for f in flags] == [False, False, False, True, True, True]
    assert flags[3]["deviation"] == pytest.approx(0.3)
    assert drift([], 0.25) == (None, [])
