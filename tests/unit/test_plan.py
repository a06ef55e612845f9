"""The pure plan step: budget, chunking, decode slots, KV shortfall, victims, feasibility.

The random tests compare `plan` with a plain-loop reference model and check every invariant of
planner.py's docstring on seeded random snapshots (hypothesis is not a pinned dependency).
"""

from __future__ import annotations

import random

import pytest

from s2l_sglang.sched import policy as policy_mod
from s2l_sglang.sched.planner import choose_victims, plan
from s2l_sglang.sched.policy import Policy, get_policy, policy_names, register
from s2l_sglang.sched.snapshot import Plan, ReqView


def view(
    rid: str,
    *,
    complete: bool = True,
    arrival: float = 0.0,
    held: int = 0,
    pending: int = 0,
    decoding: bool = False,
    reclaimable: int | None = None,
) -> ReqView:
    state = "running" if held or decoding else "waiting"
    if not decoding and pending == 0:
        state = "idle"
    return ReqView(
        rid=rid,
        is_stream=True,
        complete=complete,
        arrival=arrival,
        last_chunk=arrival,
        held=held,
        pending=pending,
        state=state,
        decoding=decoding,
        reclaimable_kv=held if reclaimable is None else reclaimable,
    )


def test_budget_respected_and_last_prefill_chunked() -> None:
    vs = [
        view("a", pending=300),
        view("b", pending=300, arrival=1),
        view("c", pending=5, arrival=2),
    ]
    p = plan(vs, "fcfs", token_budget=512, free_kv=10_000)
    assert p.granted == {"a": 300, "b": 212}  # c: budget spent; b is the one chunked prefill
    assert p.kv_needed == 512 and p.kv_shortfall == 0 and p.victims == ()
    assert p.order == ("a", "b", "c")


def test_decoding_requests_take_one_token_each_first() -> None:
    vs = [
        view("pre", pending=100, arrival=0),
        view("d1", decoding=True, held=20, arrival=1),
        view("d2", decoding=True, held=20, arrival=2),
    ]
    assert plan(vs, "fcfs", 50, 10_000).granted == {"pre": 48, "d1": 1, "d2": 1}
    # fewer budget tokens than decoders: the highest-priority decoders, no prefill at all
    p = plan(vs, "fcfs", 1, 10_000)
    assert p.granted == {"d1": 1}
    assert p.victims == ("d2",)


def test_zero_budget_grants_nothing_and_all_holders_are_victims() -> None:
    vs = [
        view("a", pending=5, held=3),
        view("b", decoding=True, held=4, arrival=1),
    ]
    p = plan(vs, "fcfs", 0, 100)
    assert p.grants == () and p.victims == ("b", "a") and p.kv_shortfall == 0


def test_negative_inputs_rejected() -> None:
    with pytest.raises(ValueError):
        plan([], "fcfs", -1, 0)
    with pytest.raises(ValueError):
        plan([], "fcfs", 0, -1)


def test_kv_shortfall_preempts_idle_partial_streams_lowest_priority_first() -> None:
    vs = [
        view("idle1", complete=False, held=40, arrival=0),
        view("new", pending=100, arrival=5),
        view("idle2", complete=False, held=30, arrival=1),
        view("run", complete=False, held=20, pending=10, arrival=2),
    ]
    p = plan(vs, "fcfs", token_budget=1000, free_kv=60)
    assert p.order == ("new", "run", "idle1", "idle2")
    assert p.granted == {"new": 100, "run": 10}
    assert p.kv_needed == 110 and p.kv_shortfall == 50
    assert p.victims == ("idle2", "idle1")  # idle streams, lowest priority first; never "run"
    assert choose_victims(p, vs) == ["idle2", "idle1"]  # 30 < 50 <= 70
    assert choose_victims(p, vs, needed_kv=30) == ["idle2"]
    assert choose_victims(p, {v.rid: v for v in vs}, needed_kv=31) == ["idle2", "idle1"]
    assert choose_victims(p, vs, needed_kv=0) == []
    assert choose_victims(p, vs, needed_kv=10**6) == ["idle2", "idle1"]  # all it has


def test_infeasible_grant_shrinks_to_what_the_pool_can_hold() -> None:
    vs = [
        view("big", pending=500, held=100, arrival=0),
        view("small", pending=10, arrival=1),
        view("idle", complete=False, held=50, arrival=2),
    ]
    p = plan(vs, "fcfs", token_budget=1000, free_kv=100)
    # room for big = free 100 + idle's 50 (its own 100 stays with it) -> a 150-token chunk
    assert p.granted == {"big": 150}
    assert p.victims == ("idle",) and p.kv_shortfall == 50
    assert p.kv_needed <= 100 + 50


def test_denied_request_keeps_its_kv_from_lower_priority_requests() -> None:
    vs = [
        view("d", decoding=True, held=10, arrival=0),
        view("hog", pending=5, held=200, arrival=1),  # wants 5, nothing left for it
        view("tiny", pending=5, arrival=2),  # would fit only by preempting "hog"
    ]
    p = plan(vs, "fcfs", token_budget=100, free_kv=1)
    assert p.granted == {"d": 1}
    assert p.victims == ("hog",) and p.kv_shortfall == 0


def test_top_request_that_cannot_progress_does_not_stall_others() -> None:
    # "hog" holds the whole pool and wants more: no plan helps it this step; "tiny" proceeds
    vs = [
        view("hog", pending=5, held=200, arrival=0),
        view("tiny", pending=5, arrival=1),
    ]
    p = plan(vs, "fcfs", token_budget=100, free_kv=0)
    assert p.granted == {"tiny": 5}
    assert p.victims == ("hog",) and p.kv_shortfall == 5


def test_passed_over_request_keeps_its_kv_from_lower_grants() -> None:
    # "p2" ranks above decoder "d3" but gets no budget ("p1" took it); "d3" may use free KV
    # and the idle stream's KV, never p2's, and p2 is the last victim (protected)
    vs = [
        view("d0", decoding=True, held=5, reclaimable=0, arrival=0),
        view("p1", pending=10, arrival=1),
        view("p2", pending=5, held=50, arrival=2),
        view("d3", decoding=True, held=5, reclaimable=0, arrival=3),
        view("idle", complete=False, held=5, arrival=4),
    ]
    p = plan(vs, "default", token_budget=12, free_kv=7)
    assert p.granted == {"d0": 1, "p1": 10, "d3": 1}
    assert p.victims == ("idle", "p2") and p.kv_shortfall == 5
    assert choose_victims(p, vs) == ["idle"]
    # with 1 slot less, d3 would need p2's KV: it waits instead
    p = plan(vs, "default", token_budget=12, free_kv=6)
    assert p.granted == {"d0": 1, "p1": 10}
    assert p.victims == ("idle", "p2")


def test_default_policy_preempts_idle_streams_first() -> None:
    vs = [
        view("idle_first", complete=False, held=30, arrival=0),
        view("run", pending=100, held=10, arrival=1),
        view("late", pending=5, held=20, arrival=2),
    ]
    p = plan(vs, "default", token_budget=100, free_kv=50)
    assert p.granted == {"run": 100} and p.kv_shortfall == 50
    assert p.victims == ("idle_first", "late")  # the idle stream first, though ranked first
    assert choose_victims(p, vs) == ["idle_first", "late"]
    assert choose_victims(p, vs, needed_kv=30) == ["idle_first"]


def test_policy_changes_who_gets_scarce_kv() -> None:
    vs = [
        view("early", complete=False, held=10, pending=50, arrival=0, reclaimable=0),
        view("most", complete=False, held=300, pending=50, arrival=1, reclaimable=0),
    ]
    assert plan(vs, "fcfs", 1000, 40).granted == {"early": 40}
    assert plan(vs, "mcps", 1000, 40).granted == {"most": 40}


# ---- random snapshots: every invariant of planner.py's docstring, and a reference model ----


def reference_plan(views: list[ReqView], policy: str, budget: int, free_kv: int) -> Plan:
    """The plan semantics as one plain loop, no shortcuts (the planner must agree exactly)."""
    order = get_policy(policy).order(views)
    n_dec = sum(v.decoding for v in order)
    dec_left = min(n_dec, budget)
    pre_left = budget - dec_left
    room = free_kv + sum(v.reclaimable_kv for v in order)
    grants: list[tuple[str, int]] = []
    for v in order:
        if v.decoding:
            want = 1 if dec_left else 0
            dec_left -= want
        elif v.pending:
            want = min(pre_left, v.pending)
        else:
            continue
        cap = room - v.reclaimable_kv
        if want and cap > 0:
            want = min(want, cap)
            grants.append((v.rid, want))
            room = cap - want
            if not v.decoding:
                pre_left -= want
        elif grants:
            room = cap  # protect it: grants below may not use its KV
    got = dict(grants)
    rank = {v.rid: k for k, v in enumerate(order)}
    first = rank[grants[0][0]] if grants else len(order)
    last = rank[grants[-1][0]] if grants else len(order)

    def group(v: ReqView) -> int:  # preemption order: no work, unprotected, protected
        return 0 if not v.has_work else 2 if first < rank[v.rid] < last else 1

    holders = [v for v in order if v.rid not in got and v.reclaimable_kv > 0]
    victims = sorted(holders, key=lambda v: (group(v), -rank[v.rid]))
    need = sum(got.values())
    return Plan(
        grants=tuple(grants),
        order=tuple(v.rid for v in order),
        victims=tuple(v.rid for v in victims),
        kv_needed=need,
        kv_shortfall=max(0, need - free_kv),
    )


def check_invariants(views: list[ReqView], policy: str, budget: int, free_kv: int) -> None:
    p = plan(views, policy, budget, free_kv)
    assert p == reference_plan(views, policy, budget, free_kv)
    by = {v.rid: v for v in views}
    rank = {rid: i for i, rid in enumerate(p.order)}
    got = p.granted
    assert sorted(p.order) == sorted(by)
    # I1 budget
    assert sum(got.values()) <= budget
    # I2 work: decode exactly 1, prefill 1..pending, grants in order, one truncated chunk at most
    for g in p.grants:
        v = by[g.rid]
        assert v.has_work
        assert g.tokens == 1 if v.decoding else 1 <= g.tokens <= v.pending
    assert [rank[g.rid] for g in p.grants] == sorted(rank[g.rid] for g in p.grants)
    prefills = [g for g in p.grants if not by[g.rid].decoding]
    assert all(g.tokens == by[g.rid].pending for g in prefills[:-1])
    # I4 victims: exactly the ungranted KV holders, never a granted one
    holders = {r for r in p.order if r not in got and by[r].reclaimable_kv > 0}
    assert set(p.victims) == holders and len(p.victims) == len(holders)
    first = rank[p.grants[0].rid] if p.grants else len(views)
    last = rank[p.grants[-1].rid] if p.grants else len(views)

    def protected(r: str) -> bool:
        return by[r].has_work and first < rank[r] < last

    # I3 KV: the unprotected victims cover the shortfall; choose_victims never goes further
    assert p.kv_needed == sum(got.values())
    assert p.kv_shortfall == max(0, p.kv_needed - free_kv)
    cover = sum(by[r].reclaimable_kv for r in holders if not protected(r))
    assert p.kv_needed <= free_kv + cover
    chosen = choose_victims(p, views)
    assert sum(by[r].reclaimable_kv for r in chosen) >= p.kv_shortfall
    assert not any(protected(r) for r in chosen)
    # budget of each request as if nothing were granted: the decode reservation comes first
    decoders = [r for r in p.order if by[r].decoding]
    budgeted = set(decoders[:budget])
    prefill_budget = budget - min(len(decoders), budget)
    total_ev = sum(v.reclaimable_kv for v in views)

    def stuck(v: ReqView) -> bool:  # no budget, or no slot even with all others preempted
        has_budget = v.rid in budgeted if v.decoding else v.pending > 0 and prefill_budget > 0
        return not has_budget or free_kv + total_ev - v.reclaimable_kv < 1

    # I5 progress of the top request with work
    top = next((by[r] for r in p.order if by[r].has_work), None)
    if top is not None and not stuck(top):
        assert got.get(top.rid, 0) >= 1
    # I6: a request with work ranked above the first grant is not granted only if stuck
    assert all(stuck(by[r]) for r in p.order[:first] if by[r].has_work)


def random_views(rng: random.Random, n: int, scale: int) -> list[ReqView]:
    views = []
    for i in range(n):
        decoding = rng.random() < 0.25
        held = rng.choice([0, rng.randint(0, 4 * scale)])
        pending = 0 if decoding else rng.choice([0, 0, 1, scale // 4, scale, 8 * scale])
        arrival = float(rng.randint(0, 8))  # coarse times: many ties
        views.append(
            ReqView(
                rid=f"s{i}",
                is_stream=True,
                complete=decoding or rng.random() < 0.5,
                arrival=arrival,
                last_chunk=arrival + rng.randint(0, 8),
                held=held,
                pending=pending,
                state="running" if decoding or held else ("waiting" if pending else "idle"),
                decoding=decoding,
                reclaimable_kv=rng.randint(0, held),
            )
        )
    return views


@pytest.mark.parametrize("policy", policy_names())
def test_invariants_hold_on_seeded_random_snapshots(policy: str) -> None:
    run_random_snapshots(policy)


def test_invariants_hold_for_a_policy_that_mixes_idle_requests_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a third-party policy need not rank idle requests last (idle_last False): the general path
    monkeypatch.setattr(policy_mod._POLICIES, "classes", dict(policy_mod._POLICIES.classes))

    @register("by-rid")
    class ByRid(Policy):
        def order(self, views):
            return sorted(views, key=lambda v: v.rid)

    run_random_snapshots("by-rid")


def run_random_snapshots(policy: str) -> None:
    rng = random.Random(2026)
    for _ in range(400):
        n = rng.choice([0, 1, 2, 5, 20, 120])
        scale = rng.choice([4, 64, 512])
        views = random_views(rng, n, scale)
        n_dec = sum(v.decoding for v in views)
        budget = rng.choice([0, 1, n_dec, n_dec + 1, rng.randint(0, 40 * scale)])
        free_kv = rng.choice([0, 1, rng.randint(0, 20 * scale), 10**9])
        check_invariants(views, policy, budget, free_kv)
