"""Phase 1 of a scheduling step: a pure plan over request snapshots (no engine, no allocation).

`plan()` decides which requests get how many tokens this step under a token budget and the free
KV; `choose_victims()` is the pure half of phase 2 (acquire): which victims to preempt, in order,
to free a given amount of KV. Preempting them (recompute or swap) is the integrator's job.

Terms: a request has *work* if it is decoding or has pending tokens. It is *passed over* if it
has work, is ranked between the first and the last grant, and got nothing (no budget or no KV
left for it); grants ranked below it were planned without its KV, so it is *protected*.

Invariants of every `Plan` (tests/unit/test_plan.py checks them on random snapshots, and checks
`plan` equal to a plain one-loop reference model):
  I1 budget:   sum(granted tokens) <= token_budget.
  I2 work:     only requests with work are granted: a decoding request exactly 1 token, a prefill
               1..pending tokens; grants follow the policy order; at most one prefill grant is
               truncated (a chunked prefill), the last prefill grant.
  I3 KV:       kv_needed <= free_kv + the reclaimable KV of the unprotected victims, so preempting
               victims in order (`choose_victims`) always makes the plan fit and never reaches
               a protected one; kv_shortfall = max(0, kv_needed - free_kv).
  I4 victims:  exactly the requests not granted that hold reclaimable KV (never a granted one),
               in preemption order: first those without work (idle partial streams), then the
               unprotected ones with work, then the protected ones; lowest priority first in each.
  I5 progress: the highest-priority request with work gets >= 1 token if it has budget (a
               prefill: token_budget > number of decoding requests; a decoder: one of the first
               token_budget decoders) and free_kv + the reclaimable KV of all other requests >= 1.
               So the engine never stalls while the top request can fit at all.
  I6 no inversion: a request with work is preempted for a lower-priority grant only when
               nothing ranked above it was granted: then it could not progress this step anyway
               (no slot even with every other request preempted, or no budget), and keeping
               its KV could stall everyone (I5). Otherwise it keeps its KV (protected) and waits
               for the grants above it to release theirs.
Budget and KV are counted in tokens. With page_size > 1 the integrator passes free KV in whole
pages' worth of tokens; `choose_victims` takes the amount it actually failed to allocate.

Speed (bench/micro_plan.py): the grant loop runs in Python only while prefill budget is left
(a handful of requests); after that only decoders can be granted, one token each, and that
phase runs as C-level iterator passes. Victims are found the same way.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from itertools import accumulate, compress, filterfalse, repeat
from operator import add, itemgetter, mul, not_, or_, truth

from s2l_sglang.sched.policy import Policy, get_policy
from s2l_sglang.sched.snapshot import Grant, Plan, ReqView

# field getters by index: faster than attrgetter on a NamedTuple
_F = ReqView._fields
_RID = itemgetter(_F.index("rid"))
_PENDING = itemgetter(_F.index("pending"))
_DECODING = itemgetter(_F.index("decoding"))
_RECLAIMABLE = itemgetter(_F.index("reclaimable_kv"))
_TOKENS = itemgetter(1)
_new_tuple = tuple.__new__  # builds a Grant without NamedTuple's Python-level __new__


def plan(
    views: Sequence[ReqView],
    policy: Policy | str,
    token_budget: int,
    free_kv: int,
) -> Plan:
    """Plan one step: order `views` by `policy`, then grant tokens in that order.

    Budget: decoding requests first take 1 token each (highest priority first, while
    budget lasts); prefills share the rest in priority order, the last one possibly
    chunked (fewer tokens than pending, like SGLang's chunked prefill).
    KV: each granted token needs one slot. `free_kv` is free now (the integrator includes
    what the prefix cache can evict without preempting anyone); KV held by requests that
    are not granted is reclaimable by preempting them, so grants may exceed `free_kv` by
    up to that amount (`kv_shortfall`). A grant that does not fit is shrunk, or dropped,
    to what fits.
    """
    if token_budget < 0 or free_kv < 0:
        raise ValueError(f"need token_budget, free_kv >= 0: {token_budget}, {free_kv}")
    if isinstance(policy, str):
        policy = get_policy(policy)
    order = policy.order(views)
    n = len(order)
    dec = list(map(_DECODING, order))
    ev = list(map(_RECLAIMABLE, order))
    n_dec = dec.count(True)
    dec_left = min(n_dec, token_budget)  # decode budget, taken in priority order
    pre_left = token_budget - dec_left  # the rest is for prefill
    # room = free_kv + reclaimable KV of requests neither granted nor protected - KV of
    # grants. Granting r t tokens costs t + r.reclaimable_kv of room (r stops being
    # reclaimable); protecting r costs r.reclaimable_kv. room >= 0 after each grant: I3.
    room = free_kv + sum(ev)
    grants: list[Grant] = []
    granted: list[int] = []  # indices in `order` of the grants, ascending
    idx: list[int] = []  # those of phase B
    i = 0
    while i < n and pre_left:  # phase A: prefill budget left; prefills and decoders
        v = order[i]
        if v.decoding:  # (with prefill budget left, every decoder has its token)
            want = 1
            dec_left -= 1
        elif v.pending:
            want = min(pre_left, v.pending)
        else:
            i += 1
            continue  # no work: stays reclaimable
        cap = room - ev[i]
        if cap > 0:
            want = min(want, cap)  # only a prefill (want > 1) can be cut: a chunk
            grants.append(Grant(v.rid, want))
            granted.append(i)
            room = cap - want
            if not v.decoding:
                pre_left -= want
            if room <= 0:
                break
        elif granted:  # passed over, no KV left: protecting its KV (I6) leaves none below
            break
        # else: nothing granted above it, it cannot progress this step (I5 exception)
        i += 1
    else:  # (no break) prefill budget spent, or everyone seen
        if i < n and dec_left and room > 0:  # phase B: only decoders, 1 token each
            if granted and n_dec <= token_budget:
                idx = _decoders_fast(order, dec, ev, i, room, policy.idle_last)
            else:
                idx = _decoders_slow(order, ev, i, dec_left, room, bool(granted))
            granted += idx

    rids = list(map(_RID, order))
    if idx:  # phase B grants: 1 token each
        grants += map(_new_tuple, repeat(Grant), zip(map(rids.__getitem__, idx), repeat(1)))
    need = sum(map(_TOKENS, grants))
    return Plan(
        grants=tuple(grants),
        order=tuple(rids),
        victims=_victims(order, rids, dec, ev, grants, granted, policy.idle_last),
        kv_needed=need,
        kv_shortfall=need - free_kv if need > free_kv else 0,
    )


def _decoders_fast(
    order: list[ReqView], dec: list[bool], ev: list[int], i: int, room: int, idle_last: bool
) -> list[int]:
    """Phase B when something is granted and every remaining decoder has budget, without
    a Python loop. Each request from `i` on costs room as the loop would charge it (a
    decoder 1 + its KV, a passed-over prefill its KV, one without work nothing); the
    decoders are granted up to where the running cost first reaches `room` (the last one
    included if it fits exactly). Returns their indices."""
    r_dec = dec[i:]
    end = len(r_dec) - r_dec[::-1].index(True)  # just past the last decoder
    r_ev = ev[i : i + end]
    if idle_last:  # requests without work follow every decoder: their cost never matters
        if sum(r_ev) + r_dec.count(True) <= room:  # the cost up to the last decoder fits
            return list(compress(range(i, i + end), r_dec))
        spent = list(accumulate(map(add, r_ev, r_dec)))
    else:  # requests without work can sit anywhere: they cost nothing
        work = map(truth, map(or_, r_dec, map(_PENDING, order[i : i + end])))
        spent = list(accumulate(map(mul, map(add, r_ev, r_dec), work)))
    j = bisect_left(spent, room)  # the loop would stop after request i + j
    if j < end:
        end = j + 1 if spent[j] == room else j  # i + j fits exactly, or not at all
    return list(compress(range(i, i + end), r_dec[:end]))


def _decoders_slow(
    order: list[ReqView], ev: list[int], i: int, dec_left: int, room: int, any_granted: bool
) -> list[int]:
    """Phase B, general case (some decoders lack budget, or nothing is granted yet)."""
    n = len(order)
    idx: list[int] = []
    while i < n and dec_left and room > 0:
        v = order[i]
        if v.decoding:
            dec_left -= 1
            cap = room - ev[i]
            if cap > 0:
                idx.append(i)
                any_granted = True
                room = cap - 1
            elif any_granted:
                break  # no KV: protecting it leaves room <= 0 for everyone below
        elif v.pending and any_granted:  # passed over (no budget): protect it
            room -= ev[i]
        i += 1
    return idx


def _victims(
    order: list[ReqView],
    rids: list[str],
    dec: list[bool],
    ev: list[int],
    grants: list[Grant],
    granted: list[int],
    idle_last: bool,
) -> tuple[str, ...]:
    """Ungranted KV holders in preemption order (I4). Outside the span of the grants
    nobody is granted; inside it, the ungranted holders with work were passed over and
    are protected (they go last). `granted`: ascending indices of the grants."""
    n = len(order)
    first, last = (granted[0], granted[-1]) if granted else (n, n)
    idle: list[str] = []
    if not idle_last:  # requests without work go first, wherever the policy ranks them
        work = list(map(truth, map(or_, dec, map(_PENDING, order))))
        idle = list(compress(rids[::-1], map(mul, ev[::-1], map(not_, work[::-1]))))
        ev = list(map(mul, ev, work))  # from here on: holders with work only
    # (with idle_last, requests without work rank last: they lead `out` anyway)
    # [last+1, n) then [0, first) then (first, last), each lowest priority first
    out = list(compress(rids[:last:-1], ev[:last:-1]))
    if first:
        out += compress(rids[first - 1 :: -1], ev[first - 1 :: -1])
    if last - first > 1:
        mid = compress(rids[last - 1 : first : -1], ev[last - 1 : first : -1])
        out += filterfalse(set(map(_RID, grants)).__contains__, mid)
    return tuple(idle + out) if idle else tuple(out)


def choose_victims(
    plan: Plan,
    views: Sequence[ReqView] | Mapping[str, ReqView],
    needed_kv: int | None = None,
) -> list[str]:
    """The shortest prefix of `plan.victims` whose reclaimable KV covers `needed_kv`
    (default: `plan.kv_shortfall`); all victims when they cannot cover it; empty when
    nothing is needed.

    The acquire phase calls this with the KV it actually failed to allocate (page rounding
    can make it differ from the plan's figure), then preempts the returned rids in order.
    """
    need = plan.kv_shortfall if needed_kv is None else needed_kv
    if need <= 0 or not plan.victims:
        return []
    by_rid = views if isinstance(views, Mapping) else {v.rid: v for v in views}
    out: list[str] = []
    freed = 0
    for rid in plan.victims:
        out.append(rid)
        freed += by_rid[rid].reclaimable_kv
        if freed >= need:
            break
    return out
