"""Policy orders: complete-before-partial, work-before-idle, direction, tie-breaks, registry."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from s2l_sglang.sched import policy as policy_mod
from s2l_sglang.sched.policy import Policy, get_policy, policy_names, register
from s2l_sglang.sched.snapshot import ReqView


def view(
    rid: str,
    *,
    stream: bool = True,
    complete: bool = True,
    arrival: float = 0.0,
    last_chunk: float | None = None,
    held: int = 0,
    pending: int = 10,
    decoding: bool = False,
) -> ReqView:
    state = "running" if held or decoding else "waiting"
    if not decoding and pending == 0:
        state = "idle"
    return ReqView(
        rid=rid,
        is_stream=stream,
        complete=complete if stream else True,
        arrival=arrival,
        last_chunk=arrival if last_chunk is None else last_chunk,
        held=held,
        pending=0 if decoding else pending,
        state=state,
        decoding=decoding,
        reclaimable_kv=held,
    )


def rids(policy: str, views: list[ReqView]) -> list[str]:
    return [v.rid for v in get_policy(policy).order(views)]


def test_registry_names_and_errors() -> None:
    assert policy_names()[:4] == ["default", "fcfs", "lcas", "mcps"]
    assert get_policy("lcas").name == "lcas"
    with pytest.raises(ValueError, match="choose from"):
        get_policy("nope")
    with pytest.raises(ValueError, match="already registered"):
        register("fcfs")(Policy)


def test_new_policy_is_one_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_mod._POLICIES, "classes", dict(policy_mod._POLICIES.classes))

    @register("by-rid-desc")
    class ByRidDesc(Policy):
        def order(self, views):
            return sorted(views, key=lambda v: v.rid, reverse=True)

    assert "by-rid-desc" in policy_names()
    assert rids("by-rid-desc", [view("a"), view("b")]) == ["b", "a"]


def test_default_keeps_input_order_committed_first_and_lists_idle_last() -> None:
    vs = [
        view("p", complete=False, arrival=0.0),
        view("idle", complete=False, pending=0, held=5),
        view("c", arrival=9.0),
        view("idle2", complete=False, pending=0, held=5, arrival=-1.0),
        view("d", decoding=True, held=3, arrival=5.0),
    ]
    # committed work (c, d) in the given order, then speculative work (p), then idle streams
    assert rids("default", vs) == ["c", "d", "p", "idle", "idle2"]
    assert rids("default", vs[::-1]) == ["d", "c", "p", "idle2", "idle"]


def test_fcfs_complete_before_partial_then_arrival() -> None:
    vs = [
        view("p_early", complete=False, arrival=0.0),
        view("c_late", arrival=3.0),
        view("plain", stream=False, arrival=2.0),
        view("c_early", arrival=1.0),
        view("p_late", complete=False, arrival=4.0),
    ]
    assert rids("fcfs", vs) == ["c_early", "plain", "c_late", "p_early", "p_late"]


def test_fcfs_serves_final_contexts_by_when_they_became_final_not_by_stream_age() -> None:
    """A final context is not overtaken by an older stream whose context became final after
    it (the order waiting for the full context serves them in); plain requests keep their own
    arrival; speculative work still goes by stream arrival."""
    vs = [
        view("old_stream_final_late", arrival=0.0, last_chunk=12.0),
        view("young_stream_final_first", arrival=5.0, last_chunk=10.0),
        view("plain", stream=False, arrival=11.0),
        view("spec_young", complete=False, arrival=3.0, last_chunk=4.0),
        view("spec_old", complete=False, arrival=1.0, last_chunk=9.0),
    ]
    assert rids("fcfs", vs) == [
        "young_stream_final_first", "plain", "old_stream_final_late", "spec_old", "spec_young",
    ]  # fmt: skip


def test_work_before_idle_and_idle_ranks_last() -> None:
    vs = [
        view("idle_old", complete=False, pending=0, held=50, arrival=0.0),
        view("partial", complete=False, arrival=2.0),
        view("complete", arrival=3.0),
        view("decode", decoding=True, held=9, arrival=4.0),
    ]
    assert rids("fcfs", vs) == ["complete", "decode", "partial", "idle_old"]
    assert rids("lcas", vs) == ["complete", "decode", "partial", "idle_old"]
    assert rids("mcps", vs)[-1] == "idle_old"


def test_lcas_earliest_last_chunk_first_complete_before_partial() -> None:
    vs = [
        # x started first but its context changed last: LCAS ranks it after y; so does FCFS,
        # whose committed work goes by when its context became final (its speculative work
        # goes by stream arrival)
        view("x", arrival=0.0, last_chunk=5.0),
        view("y", arrival=1.0, last_chunk=2.0),
        view("p_old", complete=False, arrival=0.5, last_chunk=0.6),
        view("p_new", complete=False, arrival=0.1, last_chunk=4.0),
    ]
    assert rids("lcas", vs) == ["y", "x", "p_old", "p_new"]
    assert rids("fcfs", vs) == ["y", "x", "p_new", "p_old"]  # (speculative: by arrival)


def test_mcps_most_computed_first_among_speculative_work() -> None:
    vs = [
        view("c_small", held=10, arrival=0.0),
        view("p_big", complete=False, held=500, arrival=1.0),
        view("c_mid", held=100, arrival=2.0),
        view("p_small", complete=False, held=50, arrival=0.5),
    ]
    # a speculative stream never goes before committed work, however much it holds
    assert rids("mcps", vs) == ["c_small", "c_mid", "p_big", "p_small"]


def test_mcps_serves_final_contexts_by_when_they_became_final_whatever_they_hold() -> None:
    """Committed work under mcps goes in the order its TTFT clock started (`last_chunk`), as
    under lcas: a final context that holds no KV is not overtaken by later ones that do."""
    vs = [
        view("later_with_kv", held=900, arrival=0.0, last_chunk=12.0),
        view("first_final_no_kv", held=0, arrival=3.0, last_chunk=10.0),
        view("plain", stream=False, arrival=11.0),
        view("spec_with_kv", complete=False, held=800, arrival=1.0, last_chunk=9.0),
        view("spec_no_kv", complete=False, held=0, arrival=0.5, last_chunk=1.0),
    ]
    assert rids("mcps", vs) == [
        "first_final_no_kv", "plain", "later_with_kv", "spec_with_kv", "spec_no_kv",
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["fcfs", "lcas", "mcps"])
def test_ties_broken_by_arrival_then_rid(name: str) -> None:
    vs = [
        view("b", arrival=1.0, last_chunk=7.0, held=5),
        view("a", arrival=1.0, last_chunk=7.0, held=5),
        view("c", arrival=0.5, last_chunk=7.0, held=5),
    ]
    assert rids(name, vs) == ["c", "a", "b"]


@pytest.mark.parametrize("name", ["fcfs", "lcas", "mcps"])
def test_order_is_deterministic_in_input_order(name: str) -> None:
    rng = random.Random(7)
    vs = [
        view(
            f"r{i}",
            complete=rng.random() < 0.5,
            arrival=float(rng.randint(0, 3)),
            last_chunk=float(rng.randint(3, 6)),
            held=rng.choice([0, 8, 16]),
            pending=rng.choice([0, 4]),
        )
        for i in range(60)
    ]
    first = rids(name, vs)
    for _ in range(5):
        rng.shuffle(vs)
        assert rids(name, vs) == first
    assert sorted(first) == sorted(v.rid for v in vs)


def test_sched_package_imports_no_engine() -> None:
    code = (
        "import sys, s2l_sglang.sched; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
