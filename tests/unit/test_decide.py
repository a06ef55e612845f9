"""The scheduler's decisions (`sched.decide`) on hand-built snapshots, no engine.

What SGLang's state looks like in a `Snapshot` is the adapter's business (its contract is
checked against a live scheduler in tests/integration/test_kv_pressure.py); here each decision
is pinned on a state built by hand: views, the waiting order, drops, swap-ins, preemptions
with their mode, and cancellation."""

from __future__ import annotations

import random

import pytest

from s2l_sglang.rid import (
    final_rid,
    is_speculative,
    is_volatile,
    stream_of,
    turn_rid,
    volatile_rid,
)
from s2l_sglang.sched.decide import (
    NOTHING,
    RESERVE_WINDOW_S,
    SPEC_STALL_S,
    STALL_STEPS,
    Actions,
    HostCopy,
    Preempt,
    RecentMax,
    SlotView,
    Snapshot,
    StreamInfo,
    WaitingReq,
    _head,
    _head_index,
    cap_step,
    committed_need,
    decide,
    decide_order,
    hold,
    in_force,
    may_cancel,
    promote,
    ranks,
    record_turn,
    roomy,
    views,
    waiting_req,
    waiting_views,
)
from s2l_sglang.sched.planner import choose_victims, plan
from s2l_sglang.sched.policy import get_policy
from s2l_sglang.sched.preemption import get_preemption


def waiting(rid: str, prompt: int = 100, *, hit: int = 0, max_new: int = 16, entered: float = 0.0,
            borrowed: bool = False) -> WaitingReq:  # fmt: skip
    return waiting_req(rid, prompt, hit, max_new, entered, borrowed)


def snap(*reqs: WaitingReq, slots=(), host=(), free_kv=10_000, available=None, chunked=0,
         host_free=0) -> Snapshot:  # fmt: skip
    return Snapshot(
        now=100.0,
        waiting=tuple(reqs),
        slots={s.sid: s for s in slots},
        free_kv=free_kv,
        available=free_kv if available is None else available,
        chunked_next=chunked,
        host=tuple(host),
        host_free=host_free,
    )


def idle(sid: str, tokens: int) -> SlotView:
    return SlotView(sid, tokens, tokens, inflight=False)


STREAMS = {
    "a": StreamInfo(opened=1.0, last_chunk=5.0),
    "b": StreamInfo(opened=2.0, last_chunk=6.0),
    "c": StreamInfo(opened=3.0, last_chunk=7.0, complete=True),
}


def test_a_waiting_request_carries_its_stream_and_whether_it_is_a_volatile_tail():
    """The adapter splits each rid once (`rid.parts`); the decisions read `sid`,
    `volatile` and `speculative` and split none, so all three must be what the rid says."""
    cases = {
        "plain-1": ("", False, False),
        "plain::s2l-x": ("plain", False, True),  # not a final tail: a prefill turn's
        turn_rid("a.b", 2): ("a.b", False, True),
        volatile_rid("a.b", 3): ("a.b", True, True),
        final_rid("a.b"): ("a.b", False, False),
        final_rid("a.b", 2): ("a.b", False, False),
        final_rid("a::s2l1.b", 12): ("a::s2l1.b", False, False),
    }
    for rid, (sid, volatile, speculative) in cases.items():
        w = waiting(rid)
        assert (w.sid, w.volatile, w.speculative) == (sid, volatile, speculative), rid
        assert w.sid == (stream_of(rid) or "") and w.volatile == is_volatile(rid), rid
        assert w.speculative == is_speculative(rid), rid


def test_views_count_a_plain_requests_prefix_hit_and_keep_its_queue_entry_time():
    [plain] = views(snap(waiting("plain-1", 100, hit=60, max_new=16, entered=4.5)), STREAMS)
    assert (plain.is_stream, plain.complete, plain.arrival, plain.last_chunk) == (
        False,
        True,
        4.5,
        4.5,
    )
    assert plain.pending == 100 - 60 + 16  # the extend past the hit, plus the output budget
    assert plain.reclaimable_kv == 0


def test_views_of_stream_turns_and_idle_slots():
    s = snap(
        waiting(turn_rid("a", 2), 300),  # a's next turn, slot not borrowed yet: preemptible
        waiting(turn_rid("b", 1), 200, borrowed=True),  # runs on b's row: not preemptible
        slots=[
            SlotView("a", 250, 260, inflight=True),
            SlotView("b", 120, 120, inflight=True),
            idle("c", 400),
        ],
    )
    by = {v.rid: v for v in views(s, STREAMS)}
    a, b, c = by[turn_rid("a", 2)], by[turn_rid("b", 1)], by["c"]
    assert (a.held, a.pending, a.reclaimable_kv, a.arrival) == (250, 300 - 250 + 16, 260, 1.0)
    assert (b.held, b.reclaimable_kv) == (120, 0)
    assert (c.state, c.pending, c.held, c.reclaimable_kv, c.complete) == ("idle", 0, 400, 400, True)
    assert "a" not in by and "b" not in by  # a slot with a turn in flight is not idle


def test_order_puts_committed_work_first_and_volatile_tails_last_under_every_policy():
    s = snap(
        waiting(volatile_rid("a", 3), entered=0.1),
        waiting(turn_rid("b", 1), entered=0.2),
        waiting("plain-1", entered=9.0),
        waiting(final_rid("c"), entered=9.5),
    )
    for name in ("fcfs", "lcas", "mcps", "default"):
        order = decide_order(s, STREAMS, get_policy(name), name == "default")
        assert order is not None
        assert set(order[:2]) == {"plain-1", final_rid("c")}, name
        assert order[2:] == (turn_rid("b", 1), volatile_rid("a", 3)), name


def test_a_promoted_turn_ranks_as_committed_work_under_every_policy():
    """A finishing stream's turn that could not be cancelled (it waits on its session's KV)
    is promoted: the final turn waits for it, so it must not wait behind speculative work.
    Stream a's stable turn and b's volatile tail are promoted; c's turn stays speculative."""
    streams = {**STREAMS, "c": StreamInfo(opened=0.5, last_chunk=0.6)}
    s = snap(
        waiting(turn_rid("c", 2), entered=0.3),
        waiting(turn_rid("a", 2), entered=0.1, borrowed=True),
        waiting(volatile_rid("b", 3), entered=0.2, borrowed=True),
        waiting("plain-1", entered=9.0),
    )
    for name in ("fcfs", "lcas", "mcps", "default"):
        before = decide_order(s, streams, get_policy(name), name == "default")
        assert before[0] == "plain-1" and before[-1] == volatile_rid("b", 3), name
        promoted = dict(streams)
        for rid in (turn_rid("a", 2), volatile_rid("b", 3)):
            promoted[stream_of(rid)] = promote(promoted, rid, 50.0)
        order = decide_order(s, promoted, get_policy(name), name == "default")
        assert set(order[:3]) == {turn_rid("a", 2), volatile_rid("b", 3), "plain-1"}, name
        assert order[3] == turn_rid("c", 2), name
        head = _head_index(s, promoted, ranks(get_policy(name)))
        assert s.waiting[head].rid in order[:3] and s.waiting[head].rid == order[0], name
    assert promote(STREAMS, turn_rid("a", 2), 50.0) == StreamInfo(1.0, 50.0, True)


def test_default_keeps_sglangs_order_while_nothing_speculative_waits():
    s = snap(waiting("plain-2", entered=2.0), waiting(final_rid("a"), entered=1.0))
    assert decide_order(s, STREAMS, get_policy("default"), True) is None
    assert decide_order(snap(waiting("plain-1")), STREAMS, get_policy("fcfs"), False) is None


def test_fcfs_orders_plain_requests_by_their_own_entry_time():
    """No starvation by order: a plain request that entered earlier goes first however many
    later requests arrive (its arrival is never re-stamped)."""
    s = snap(*(waiting(f"plain-{i}", entered=10.0 - i) for i in range(5)))
    order = decide_order(s, STREAMS, get_policy("fcfs"), False)
    assert order == tuple(f"plain-{i}" for i in reversed(range(5)))


def test_roomy_only_while_all_the_waiting_work_fits_the_free_kv_at_once():
    """Each waiting request counts its extend past its hit, its output budget and its locked
    prefix; the mid-prefill chunk, the admission's extra and the reserve count too."""
    reqs = (waiting("plain-1", 100, hit=40, max_new=16), waiting(turn_rid("a", 1), 200))
    need = (100 - 40 + 16) + (200 + 16)  # 292
    assert roomy(snap(*reqs, free_kv=need)) and not roomy(snap(*reqs, free_kv=need - 1))
    extras = snap(*reqs, free_kv=need + 30, chunked=10)._replace(admit_extra=10, spec_reserve=10)
    assert roomy(extras) and not roomy(extras._replace(spec_reserve=11))
    locked = snap(reqs[0]._replace(prefix_free=30), reqs[1], free_kv=need + 29)
    assert not roomy(locked) and roomy(locked._replace(free_kv=need + 30))
    assert roomy(snap(free_kv=0))  # nothing waits
    fits = snap(*reqs, free_kv=10_000)
    assert not roomy(fits._replace(host=(HostCopy("b", 10, True),)))  # KV was swapped out
    assert not roomy(fits._replace(stalled=1)) and not roomy(fits._replace(stalled_s=0.5))


def test_mcps_orders_speculative_work_as_lcas_while_the_pool_holds_it_all():
    """Stream b holds more KV, stream a has the older unprefilled chunk: with KV to spare
    mcps sends a's turn first (as lcas does), under pressure b's (most computed first);
    committed work goes first either way. fcfs and lcas never switch."""
    s = snap(
        waiting(turn_rid("a", 1), 150, hit=50, entered=0.2),
        waiting(turn_rid("b", 1), 600, hit=500, entered=0.1),
        waiting("plain-1", entered=9.0),
        slots=(SlotView("a", 50, 50, True), SlotView("b", 500, 500, True)),
        free_kv=10_000,
    )
    mcps, lcas = get_policy("mcps"), get_policy("lcas")
    tight = s._replace(free_kv=300)  # 116 short
    assert roomy(s) and not roomy(tight)
    assert in_force(mcps, s).name == "lcas" and in_force(mcps, tight) is mcps
    for name in ("fcfs", "lcas", "default"):
        assert in_force(get_policy(name), s).name == name
    spare = ("plain-1", turn_rid("a", 1), turn_rid("b", 1))
    assert decide_order(s, STREAMS, mcps, False) == spare == decide_order(s, STREAMS, lcas, False)
    assert decide_order(tight, STREAMS, mcps, False) == ("plain-1", turn_rid("b", 1),
                                                         turn_rid("a", 1))  # fmt: skip
    assert decide_order(tight, STREAMS, lcas, False) == spare


def test_nothing_waits_only_stale_host_copies_go():
    s = snap(
        slots=[idle("a", 10)],
        host=[HostCopy("a", 10, True), HostCopy("gone", 20, False), HostCopy("b", 5, True)],
    )
    actions = decide(s, STREAMS, get_policy("fcfs"), get_preemption("swap"))
    assert actions.drop_copies == ("a", "gone")  # a holds a slot again; gone closed
    assert actions.swap_in == () and actions.preempt == ()
    assert decide(snap(), STREAMS, get_policy("fcfs"), get_preemption("swap")) is NOTHING


def test_swap_in_the_next_admission_always_and_others_only_into_free_kv():
    s = snap(
        waiting(final_rid("c"), 500),  # committed: fcfs admits it first
        waiting(turn_rid("a", 2), 500),
        waiting(turn_rid("b", 2), 500),
        host=[HostCopy("c", 900, True), HostCopy("a", 300, True), HostCopy("b", 100, True)],
        free_kv=5_000,
        available=1_000,
    )
    actions = decide(s, STREAMS, get_policy("fcfs"), get_preemption("swap"))
    # c goes back first (it is next); a does not fit the 100 free tokens left; b does
    assert actions.swap_in == ("c", "b")
    # the next admission's copy goes back even into no free KV (it evicts LRU cache); then
    # nothing is free for the others
    tight = decide(s._replace(available=400), STREAMS, get_policy("fcfs"), get_preemption("swap"))
    assert tight.swap_in == ("c",)
    # copies swapped in before (kept on the host until their stream holds a slot) come back
    # again only for the next admission: what LRU eviction took of them
    again = s._replace(host=tuple(h._replace(restored=True) for h in s.host))
    assert decide(again, STREAMS, get_policy("fcfs"), get_preemption("swap")).swap_in == ("c",)


def test_preempt_the_idle_stream_when_the_next_admission_lacks_kv():
    s = snap(
        waiting("plain-1", 1_000, max_new=0, entered=1.0),
        slots=[idle("a", 800), idle("b", 300)],
        free_kv=600,
    )
    actions = decide(s, STREAMS, get_policy("fcfs"), get_preemption("recompute"))
    assert actions.planned and actions.shortfall == 400
    # lowest priority first (b opened later), and only as many as the shortfall needs
    assert [p[:2] for p in actions.preempt] == [("b", "recompute"), ("a", "recompute")]
    enough = decide(s._replace(free_kv=1_000), STREAMS, get_policy("fcfs"),
                    get_preemption("recompute"))  # fmt: skip
    assert enough.planned and enough.preempt == () and enough.shortfall == 0


def test_the_running_batch_and_the_chunked_request_take_kv_first():
    """The adapter counts the running batch's reserve out of free_kv; the chunked request's
    next chunk is taken from it here: either can make the plan short."""
    base = snap(waiting("plain-1", 500, max_new=0), slots=[idle("a", 800)], free_kv=600)
    fcfs, recompute = get_policy("fcfs"), get_preemption("recompute")
    assert decide(base, STREAMS, fcfs, recompute).preempt == ()
    chunked = decide(base._replace(chunked_next=200), STREAMS, fcfs, recompute)
    assert chunked.shortfall == 100 and [p.sid for p in chunked.preempt] == ["a"]


def test_a_prefix_hit_makes_a_plan_fit():
    s = snap(waiting("plain-1", 1_000, hit=800, max_new=0), slots=[idle("a", 500)], free_kv=300)
    assert decide(s, STREAMS, get_policy("fcfs"), get_preemption("recompute")).preempt == ()
    s = s._replace(waiting=(waiting("plain-1", 1_000, hit=0, max_new=0),))
    assert [p.sid for p in decide(s, STREAMS, get_policy("fcfs"),
                                  get_preemption("recompute")).preempt] == ["a"]  # fmt: skip


def test_swap_while_the_host_pool_has_room_then_recompute():
    s = snap(
        waiting("plain-1", 2_000, max_new=0),
        slots=[idle("a", 800), idle("b", 700)],
        free_kv=600,
        host_free=1_000,
    )
    actions = decide(s, STREAMS, get_policy("fcfs"), get_preemption("swap"))
    assert [(p.sid, p.mode, p.tokens) for p in actions.preempt] == [
        ("b", "swap", 700),
        ("a", "recompute", 800),  # 300 left in the host pool: a does not fit
    ]


def test_speculative_work_swaps_victims_out_and_never_makes_them_recompute():
    """A head whose context is not final takes KV from other streams only by swap, and only
    when swaps cover its shortfall; a committed head (plain, or a final turn) recomputes
    victims the host pool cannot take."""
    fcfs = get_policy("fcfs")
    spec = waiting(turn_rid("c2", 2), 1_000, max_new=0)
    streams = {**STREAMS, "c2": StreamInfo(opened=0.5, last_chunk=0.5)}  # ranks first
    s = snap(spec, slots=[idle("a", 800), idle("b", 700)], free_kv=600, host_free=1_000)
    # recompute only: nothing for speculative work, while a final turn of the same size
    # preempts as before
    assert decide(s, streams, fcfs, get_preemption("recompute")).preempt == ()
    # ... until the engine stalls (nothing admitted, nothing running) for `SPEC_STALL_S`
    # seconds: then it is planned as committed work is (a client may wait for this prefill
    # before it finishes)
    brief = s._replace(stalled=STALL_STEPS, stalled_s=SPEC_STALL_S / 2)
    assert decide(brief, streams, fcfs, get_preemption("recompute")).preempt == ()
    stalled = brief._replace(stalled_s=SPEC_STALL_S)
    assert [p.sid for p in decide(stalled, streams, fcfs, get_preemption("recompute")).preempt] == ["b"]  # fmt: skip
    final = streams | {"c2": streams["c2"]._replace(complete=True)}
    assert [p.sid for p in decide(s, final, fcfs, get_preemption("recompute")).preempt] == ["b"]
    # swap: b (lowest priority) fits the host pool and covers the 400 lacking
    got = decide(s, streams, fcfs, get_preemption("swap"))
    assert [(p.sid, p.mode) for p in got.preempt] == [("b", "swap")]
    # the host pool holds b but not a, and b alone cannot cover a shortfall of 900:
    # nothing is preempted (a partial swap would not admit it)
    big = s._replace(waiting=(waiting(turn_rid("c2", 2), 1_500, max_new=0),))
    assert decide(big, streams, fcfs, get_preemption("swap")).preempt == ()
    assert decide(big._replace(host_free=2_000), streams, fcfs,
                  get_preemption("swap")).preempt == (Preempt("b", "swap", 700),
                                                      Preempt("a", "swap", 800))  # fmt: skip


def test_no_preemption_mode_yet_means_no_preemption():
    s = snap(waiting("plain-1", 2_000), slots=[idle("a", 800)], free_kv=0)
    assert decide(s, STREAMS, get_policy("fcfs"), None).preempt == ()


def test_a_turn_that_borrowed_its_row_is_never_a_victim():
    s = snap(
        waiting(turn_rid("a", 2), 2_000, borrowed=True),
        slots=[SlotView("a", 900, 900, inflight=True)],
        free_kv=0,
    )
    assert decide(s, STREAMS, get_policy("fcfs"), get_preemption("recompute")) is NOTHING


def test_may_cancel_only_a_waiting_speculative_turn_that_has_not_borrowed_its_row():
    s = snap(
        waiting(turn_rid("a", 2)),
        waiting(turn_rid("b", 2), borrowed=True),
        waiting(final_rid("c")),
    )
    assert may_cancel(s, turn_rid("a", 2))
    assert not may_cancel(s, turn_rid("b", 2))  # SGLang would drop b's slot
    assert not may_cancel(s, final_rid("c"))  # committed work is never cancelled
    assert not may_cancel(s, turn_rid("a", 3))  # not waiting (running, or gone)


def test_record_turn_keeps_the_opening_time_and_marks_the_final_turn():
    first = record_turn({}, turn_rid("x", 1), 3.0)
    assert first == StreamInfo(3.0, 3.0, False)
    final = record_turn({"x": first}, final_rid("x"), 8.0)
    assert final == StreamInfo(3.0, 8.0, True)


def test_the_next_admission_is_never_a_volatile_tail_while_other_work_waits():
    """decide plans for the request `decide_order` puts first: a volatile tail goes after
    everything, so KV is never freed for it while a stable turn waits."""
    s = snap(
        waiting(volatile_rid("a", 3), 900, max_new=0),  # a opened first: fcfs ranks it first
        waiting(turn_rid("b", 2), 300, max_new=0),
        slots=[idle("c", 800)],
        free_kv=100,
        host_free=1_000,
    )
    actions = decide(s, STREAMS, get_policy("fcfs"), get_preemption("swap"))
    assert actions.shortfall == 300 - 100  # b's extend, not a's 900
    assert [p.sid for p in actions.preempt] == ["c"]


def _reference_decide(s: Snapshot, streams, policy, preemption) -> Actions:
    """The decision as the general planner makes it: every view ordered and planned
    (`planner.plan` with the head's extend as the budget, `choose_victims`)."""
    drop = tuple(c.sid for c in s.host if not c.session_open or c.sid in s.slots)
    copies = {c.sid: c for c in s.host if c.sid not in drop}
    if not s.waiting:
        return Actions(drop_copies=drop) if drop else NOTHING
    order = [v for v in policy.order(views(s, streams)) if v.state == "waiting"]
    first = next((v for v in order if not (is_volatile(v.rid) and not (v.is_stream and v.complete))), order[0])  # fmt: skip
    swap_in, available = [], s.available
    for w in s.waiting:
        copy = copies.get(stream_of(w.rid) or "")
        if copy is None or copy.sid in swap_in:
            continue
        if w.rid != first.rid and (copy.restored or available < copy.size):
            continue
        swap_in.append(copy.sid)
        available = max(0, available - copy.size)
    if swap_in:
        back = {sid: copies[sid].size for sid in swap_in}
        hits = []
        for w in s.waiting:
            size = back.get(stream_of(w.rid) or "", 0)
            if size > w.prefix_hit:  # the copy is evictable cache; the locked part stays
                w = w._replace(prefix_hit=size, prefix_free=size - w.prefix_hit + w.prefix_free)
            hits.append(w)
        s = s._replace(waiting=tuple(hits))
    done = Actions(drop, tuple(swap_in)) if drop or swap_in else NOTHING
    all_views = views(s, streams)
    if preemption is None or not any(v.reclaimable_kv for v in all_views):
        return done
    first = next(v for v in all_views if v.rid == first.rid)
    free_kv = max(0, s.free_kv - s.chunked_next)
    # the head asks what SGLang's admission asks: its extend and output, the extra, and the
    # evictable part of its prefix; after a stall, one token more than it finds free
    [w] = [w for w in s.waiting if w.rid == first.rid]
    lifted = s.stalled_s >= SPEC_STALL_S
    speculative = is_speculative(first.rid) and not first.complete and not lifted
    # speculative work leaves the reserve free for committed work, in KV and host pool alike
    reserve = s.spec_reserve if speculative else 0
    need = first.pending + s.admit_extra + w.prefix_free + reserve
    forced = need <= free_kv and s.stalled >= STALL_STEPS
    first = first._replace(pending=free_kv + 1 if forced else need)
    # the head first, as SGLang's admission takes it; then the others in the policy's order
    ranked = [first] + [v for v in policy.order(all_views) if v.rid != first.rid]
    cap = free_kv + sum(v.reclaimable_kv for v in ranked[1:])
    if cap <= 0:  # no victim can make room
        return done._replace(planned=True)
    if speculative and first.pending > cap and not forced:  # swaps would not admit it
        return done._replace(planned=True)
    step = plan(ranked, get_policy("default"), first.pending, free_kv)
    if step.kv_shortfall <= 0:
        return done._replace(planned=True)
    by_rid = {v.rid: v for v in all_views}
    preempt, host_free = [], s.host_free + sum(copies[sid].size for sid in swap_in)
    # a speculative head: swaps only, taken along the whole victim order, all or nothing
    for rid in step.victims if speculative else choose_victims(step, by_rid):
        v = by_rid[rid]
        sid = rid if v.state == "idle" else stream_of(rid)
        if not v.reclaimable_kv or sid not in s.slots:
            continue
        mode = preemption.decide(v.reclaimable_kv, host_free - reserve)
        if speculative and mode != "swap":
            continue
        host_free -= v.reclaimable_kv if mode == "swap" else 0
        preempt.append(Preempt(sid, mode, v.reclaimable_kv))
        if speculative and sum(p.tokens for p in preempt) >= step.kv_shortfall:
            break
    if speculative and sum(p.tokens for p in preempt) < step.kv_shortfall:
        preempt = []
    head_speculative = is_speculative(first.rid) and not first.complete
    return Actions(drop, tuple(swap_in), tuple(preempt), step.kv_shortfall, True, forced and bool(preempt),
                   head_speculative and bool(preempt))  # fmt: skip


def _random_snapshot(rng: random.Random) -> tuple[Snapshot, dict[str, StreamInfo]]:
    """A small random scheduler state: plain requests, stream turns (stable, volatile, final;
    on their row or not), idle and busy slots, host copies, tight or ample KV."""
    waiting_, slots, host, streams = [], {}, [], {}
    for i in range(rng.randint(0, 12)):
        sid = f"s{i}"
        kind = rng.random()
        at = float(rng.randint(0, 5))  # repeated times: ties go to the rid order
        held = rng.randint(0, 600)
        if kind < 0.2:
            waiting_.append(
                waiting_req(
                    f"p{i}",
                    rng.randint(1, 900),
                    hit := rng.randint(0, 300),
                    rng.randint(0, 64),
                    at,
                    False,
                    rng.randint(0, hit),
                )  # fmt: skip
            )
            continue
        # complete: a final turn, or a promoted one (its stream is finishing)
        streams[sid] = StreamInfo(at, at + rng.randint(0, 5), kind > 0.85 or rng.random() < 0.1)
        inflight = kind < 0.7 or kind > 0.85
        slots[sid] = SlotView(sid, held, held + rng.randint(0, 16), inflight)
        if rng.random() < 0.2:
            del slots[sid]
        if inflight:
            rid = (final_rid(sid) if kind > 0.85 else
                   rng.choice([turn_rid(sid, 2), volatile_rid(sid, 3)]))  # fmt: skip
            waiting_.append(
                waiting_req(
                    rid,
                    held + rng.randint(1, 700),
                    hit := rng.randint(0, 200),
                    rng.randint(0, 32),
                    at,
                    borrowed := rng.random() < 0.4 and sid in slots,
                    0 if borrowed else rng.randint(0, hit),
                )  # fmt: skip
            )
        if sid not in slots and rng.random() < 0.5:
            host.append(HostCopy(sid, rng.randint(1, 500), rng.random() < 0.9,
                                 rng.random() < 0.3))  # fmt: skip
    rng.shuffle(waiting_)
    free = rng.randint(0, 1_500)
    s = Snapshot(100.0, tuple(waiting_), slots, free, rng.randint(0, free), rng.choice([0, 0, 200]),
                 tuple(host), rng.randint(0, 1_000), rng.choice([0, 2, 17]),
                 rng.choice([0, 0, 0, STALL_STEPS - 1, STALL_STEPS]),
                 rng.choice([0.0, SPEC_STALL_S]), rng.choice([0, 0, 300]))  # fmt: skip
    return s, streams


@pytest.mark.parametrize("policy", ["default", "fcfs", "lcas", "mcps"])
@pytest.mark.parametrize("mode", ["swap", "recompute", None])
def test_decide_equals_the_general_planners_decision_on_random_states(policy, mode):
    """decide plans one admission without ordering or planning every view; on 400 random
    states its actions equal those of the general planner run over all of them."""
    rng = random.Random(f"{policy}-{mode}")
    pol, pre = get_policy(policy), (get_preemption(mode) if mode else None)
    preempting = 0
    for _ in range(400):
        s, streams = _random_snapshot(rng)
        got = decide(s, streams, pol, pre)
        assert got == _reference_decide(s, streams, pol, pre), s
        preempting += bool(got.preempt)
    if mode:
        assert preempting > 40  # the states do exercise the victims


@pytest.mark.parametrize("policy", ["default", "fcfs", "lcas", "mcps"])
def test_the_one_pass_head_is_the_policys_next_admission_on_random_states(policy):
    """decide finds the next admission in one pass over the queue (`ranks`) instead of
    ordering every view; on 2,000 random states (times repeat, so ties go to the rid; some
    turns belong to streams the scheduler does not know) it is the one `_head` takes from the
    policy's order."""
    rng = random.Random(f"head-{policy}")
    pol = get_policy(policy)
    checked = 0
    for _ in range(2000):
        s, streams = _random_snapshot(rng)
        if streams and rng.random() < 0.3:
            del streams[rng.choice(sorted(streams))]
        if not s.waiting:
            continue
        i = _head_index(s, streams, ranks(pol))
        if i is None:
            assert all(is_volatile(w.rid) for w in s.waiting)
            continue
        ws = waiting_views(s, streams)
        assert ws[i] == _head(pol, ws), s
        checked += 1
    assert checked > 1000


def test_nothing_is_preempted_when_no_victim_can_make_room_for_the_head():
    """The head's own unborrowed slot is its only KV around: preempting it would not admit
    it, so it waits for KV that running requests release."""
    s = snap(
        waiting(turn_rid("a", 2), 900, max_new=0),
        slots=[SlotView("a", 400, 400, inflight=True)],
        free_kv=0,
    )
    actions = decide(s, STREAMS, get_policy("fcfs"), get_preemption("recompute"))
    assert actions.planned and actions.preempt == ()


def test_the_evictable_part_of_the_heads_prefix_is_not_free_for_it():
    """The memory-pressure stall of 2026-12-03 (ANN, default policy), as its scheduler state
    was dumped: the head's 1,030-token prefix hit is evictable cache that its admission locks,
    so the 12 free tokens are all it gets. Counting the 1,000 evictable as free, the plan saw
    room, preempted nothing, and SGLang admitted nothing for 60 s beside an idle stream."""
    head = waiting(final_rid("a"), 1059, hit=1030, max_new=1)._replace(prefix_free=1000)
    s = snap(head, slots=[idle("b", 1030)], free_kv=1012, available=12)._replace(admit_extra=2)
    actions = decide(s, STREAMS, get_policy("default"), get_preemption("recompute"))
    assert actions.preempt == (Preempt("b", "recompute", 1030),)
    assert not actions.forced
    # the same head with its prefix locked by someone else fits, and nothing is preempted
    locked = s._replace(waiting=(head._replace(prefix_free=0),))
    assert decide(locked, STREAMS, get_policy("default"), get_preemption("recompute")).preempt == ()


def test_the_head_needs_more_than_its_tokens_by_the_admission_extra():
    """SGLang admits a request only when its extend, output and a page are below the free KV
    (strictly): a head whose tokens equal the free KV does not fit."""
    s = snap(waiting(final_rid("a"), 100, max_new=0), slots=[idle("b", 50)], free_kv=100)
    pol, pre = get_policy("fcfs"), get_preemption("recompute")
    assert decide(s, STREAMS, pol, pre).preempt == ()  # no extra: it fits
    assert decide(s._replace(admit_extra=2), STREAMS, pol, pre).preempt == (
        Preempt("b", "recompute", 50),
    )


def test_a_stall_frees_one_victim_though_the_head_fits_by_the_count():
    """Nothing admitted for STALL_STEPS steps while nothing ran: whatever the count says, the
    KV is not there for the head, so the lowest-priority idle stream gives its KV up (one per
    stall); a step short of the stall, nothing is preempted."""
    s = snap(
        waiting(final_rid("a"), 100, max_new=0),
        slots=[idle("b", 50), idle("c", 70)],
        free_kv=5_000,
    )
    pol, pre = get_policy("fcfs"), get_preemption("recompute")
    assert decide(s._replace(stalled=STALL_STEPS - 1), STREAMS, pol, pre).preempt == ()
    forced = decide(s._replace(stalled=STALL_STEPS), STREAMS, pol, pre)
    # idle streams in reverse policy order: c complete, b partial -> b is the lowest priority
    assert forced.preempt == (Preempt("b", "recompute", 50),) and forced.forced


def test_a_swapped_in_copy_is_evictable_prefix_that_the_head_locks():
    """The head's host copy comes back into the prefix cache (evictable): its admission locks
    it, so it is not free for the head, and an idle stream is preempted to make room."""
    s = snap(
        waiting(final_rid("a"), 600, max_new=0),
        slots=[idle("b", 300)],
        host=[HostCopy("a", 500, True)],
        free_kv=520,
        available=520,
    )
    actions = decide(s, STREAMS, get_policy("fcfs"), get_preemption("recompute"))
    assert actions.swap_in == ("a",)
    # it asks 100 + 500 (the copy, locked) > 520 free: b is preempted
    assert actions.preempt == (Preempt("b", "recompute", 300),)


def test_speculative_work_leaves_the_reserve_free_for_committed_work():
    """A speculative head asks `spec_reserve` more than its own extend (swaps only); a final
    turn of the same size asks only its own."""
    fcfs, swap = get_policy("fcfs"), get_preemption("swap")
    streams = {**STREAMS, "c2": StreamInfo(opened=0.5, last_chunk=0.5)}  # ranks first
    spec = snap(waiting(turn_rid("c2", 2), 500, max_new=0), slots=[idle("a", 400), idle("b", 300)],
                free_kv=700, host_free=1_000)  # fmt: skip
    assert decide(spec, streams, fcfs, swap).preempt == ()  # 500 fits in 700
    reserved = spec._replace(spec_reserve=300)  # 500 + 300 does not: b (lowest) is swapped
    assert decide(reserved, streams, fcfs, swap).preempt == (Preempt("b", "swap", 300),)
    final = streams | {"c2": streams["c2"]._replace(complete=True)}
    assert decide(reserved, final, fcfs, swap).preempt == ()
    # more than every holder could free: no swap would admit it, so none is done
    assert decide(spec._replace(spec_reserve=1_000), streams, fcfs, swap).preempt == ()
    # the host pool keeps the reserve free of speculative work's victims too: with 500 of
    # it free, b (300) cannot go there beside a reserve of 300; a final turn swaps it
    small_host = reserved._replace(host_free=500)
    assert decide(small_host, streams, fcfs, swap).preempt == ()
    lacking = small_host._replace(free_kv=400)  # a final turn of 500 lacks 100: b is swapped
    assert decide(lacking, final, fcfs, swap).preempt == (Preempt("b", "swap", 300),)


def test_hold_keeps_speculative_turns_out_of_the_reserve():
    """`hold` walks the queue as SGLang's admission does: committed work is charged, a
    speculative turn that does not fit in the free KV less the reserve is held."""
    streams = {**STREAMS, "d": StreamInfo(opened=4.0, last_chunk=8.0)}
    s = snap(
        waiting(final_rid("c"), 400, max_new=0),
        waiting(turn_rid("a", 2), 1_000, max_new=0),  # a's slot holds 700: it needs 300
        waiting(turn_rid("b", 2), 400, max_new=0),
        waiting(volatile_rid("d", 3), 100, max_new=0),
        slots=[SlotView("a", 700, 700, inflight=True)],
        free_kv=1_000,
    )
    order = [w.rid for w in s.waiting]
    assert hold(s, streams, order) == ()  # no reserve: SGLang admits what fits
    r = s._replace(spec_reserve=300)  # 700 to share: c 400, a 300, then b and d do not fit
    assert hold(r, streams, order) == (turn_rid("b", 2), volatile_rid("d", 3))
    # in another order the other turns are charged first
    assert hold(r, streams, order[::-1]) == (turn_rid("a", 2),)
    # a promoted turn is committed work: charged, never held
    done = streams | {"b": streams["b"]._replace(complete=True)}
    assert hold(r, done, order) == (volatile_rid("d", 3),)
    # the chunked request's next chunk comes first; a long stall lifts the hold
    assert hold(r._replace(chunked_next=300), streams, order)[0] == turn_rid("a", 2)
    assert hold(r._replace(stalled_s=SPEC_STALL_S), streams, order) == ()
    # a speculative turn is charged its prefix hit too: its admission locks that KV, and the
    # hit SGLang reported may predate a swap-in of its stream's copy
    hit = r._replace(waiting=(waiting(turn_rid("b", 2), 400, hit=300, max_new=0),), free_kv=650)
    assert hold(hit, streams) == (turn_rid("b", 2),)  # 400 > 650 - 300
    assert hold(hit._replace(free_kv=700), streams) == ()


def test_cap_step_keeps_one_steps_speculative_tokens_within_the_limit():
    """`cap_step` walks the queue in admission order: speculative turns are charged what they
    would prefill (beyond their slot or prefix hit) until the next one would pass the limit;
    committed work is never held and never charged; the first speculative turn always goes
    in unless a speculative request is already mid-prefill."""
    streams = {**STREAMS, "d": StreamInfo(opened=4.0, last_chunk=8.0)}
    s = snap(
        waiting(turn_rid("a", 2), 900, max_new=0),  # a's slot holds 700: it prefills 200
        waiting(final_rid("c"), 5_000, max_new=0),  # committed: not charged, not held
        waiting(turn_rid("b", 2), 100, max_new=0),
        waiting(volatile_rid("d", 3), 300, hit=100, max_new=0),  # 200 past its prefix hit
        slots=[SlotView("a", 700, 700, inflight=True)],
    )
    order = [w.rid for w in s.waiting]
    assert cap_step(s, streams, 256, order) == (turn_rid("b", 2), volatile_rid("d", 3))
    assert cap_step(s, streams, 300, order) == (volatile_rid("d", 3),)  # 200 + 100, then 500
    assert cap_step(s, streams, 500, order) == ()
    assert cap_step(s, streams, 100, order) == (turn_rid("b", 2), volatile_rid("d", 3))
    # in another order the others are charged first; the first always goes in
    assert cap_step(s, streams, 100, order[::-1]) == (turn_rid("b", 2), turn_rid("a", 2))
    # a turn `hold` already took out is not charged
    assert cap_step(s, streams, 300, order, {turn_rid("a", 2)}) == ()
    # a promoted turn is committed work
    done = streams | {"b": streams["b"]._replace(complete=True)}
    assert cap_step(s, done, 256, order) == (volatile_rid("d", 3),)
    assert cap_step(s, done, 400, order) == ()
    # a speculative request mid-prefill is charged its next chunk first; a committed one is not
    mid = s._replace(chunked_next=150, chunked_rid=turn_rid("d", 1))
    assert cap_step(mid, streams, 256, order) == (turn_rid("a", 2), volatile_rid("d", 3))
    plain = mid._replace(chunked_rid="plain-1")
    assert cap_step(plain, streams, 256, order) == (turn_rid("b", 2), volatile_rid("d", 3))
    assert cap_step(s, streams, 0, order) == ()  # no limit


def test_committed_need_is_the_largest_committed_request_with_no_prefix_cached():
    """Plain requests and turns of final contexts count (prompt and output budget, their
    prefix hit ignored); a speculative turn does not."""
    s = snap(
        waiting("p", 300, hit=250, max_new=20),
        waiting(final_rid("c"), 200, max_new=16),  # c's context is final
        waiting(turn_rid("a", 1), 5_000, max_new=0),  # a's is not: speculative
    )
    assert committed_need(s, STREAMS) == 320
    assert committed_need(snap(waiting(turn_rid("a", 1), 5_000)), STREAMS) == 0
    # a turn of a stream the scheduler does not know ranks as committed work, so it counts
    assert committed_need(snap(waiting(turn_rid("zz", 1), 700, max_new=0)), STREAMS) == 700


def test_the_automatic_reserve_forgets_a_large_request_after_its_window():
    """The reserve follows the largest committed need of the last `RESERVE_WINDOW_S`
    seconds: a large request seen once raises it for that long only, and a later smaller
    maximum takes over once the larger one's window is over."""
    w = RESERVE_WINDOW_S
    m = RecentMax(w)
    assert m.value(0.0) == 0
    m.observe(0.0, 8_000)  # one large request, seen waiting at t=0 and t=1
    m.observe(1.0, 8_000)
    m.observe(2.0, 0)  # nothing committed waits: no observation
    m.observe(3.0, 500)
    m.observe(4.0, 300)
    assert m.value(4.0) == 8_000
    assert m.value(1.0 + w - 0.5) == 8_000
    assert m.value(1.0 + w) == 500  # the large one's window is over
    assert m.value(3.0 + w) == 300
    assert m.value(4.0 + w) == 0
    m.observe(10.0 + w, 100)
    m.observe(11.0 + w, 900)  # a larger need after a smaller one: the larger is the reserve
    assert m.value(11.0 + w) == 900
