"""The scheduler's decisions as pure functions: `decide(snapshot, ...) -> Actions`.

SGLang's scheduler state reaches this module only as a `Snapshot` (built by
`s2l_sglang/adapter.py`, the one module that reads SGLang internals), and the decisions leave
it only as `Actions` (applied by the same adapter). Nothing here imports sglang or torch, so
every decision is unit-tested on hand-built snapshots (tests/unit/test_decide.py).

One scheduling step, before SGLang builds a prefill batch:
1. host copies nobody will swap in are dropped (their stream closed, or holds a slot again);
2. swap-ins: the host KV of streams whose next turn waits comes back, the policy's next
   admission first (evicting LRU cache if needed), others only into free KV; a copy swapped
   in before is kept on the host until its stream holds a slot, and comes back again (what
   LRU eviction took of it) only for the next admission;
3. preemptions: where the policy's next admission (the head of `decide_order`'s order) does
   not fit the free KV, its victims (idle streams, and waiting turns that have not borrowed
   their slot) are preempted, lowest priority first, each by the mode the `Preemption` picks
   for its own held tokens. This is `planner.plan`'s decision for a budget of that one
   admission, computed without ordering and planning every request each step. A head that
   is speculative work (a turn of a context not final yet) only swaps its victims out, and
   only when swaps cover its shortfall and `spec_reserve` (and leave `spec_reserve` of the
   host pool free): speculative work never makes another stream recompute what it holds
   (unless the engine has stalled a while: nothing admitted, nothing running; `lifted`).
The waiting queue's order is a separate decision (`decide_order`, at SGLang's
`calc_priority`, by the policy in force: `in_force`), and so are the speculative turns kept
out of that step's admission so that speculative KV leaves `spec_reserve` free (`hold`), and
the cancellation of a stale speculative turn (`may_cancel`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, compress
from operator import itemgetter, mul, not_
from typing import Literal, NamedTuple

from s2l_sglang.rid import is_final, is_speculative, is_volatile, parts, stream_of
from s2l_sglang.sched.policy import Policy, get_policy
from s2l_sglang.sched.preemption import Preemption
from s2l_sglang.sched.snapshot import ReqView


class StreamInfo(NamedTuple):
    """What the scheduler knows of one stream from its turns (perf_counter seconds)."""

    opened: float
    last_chunk: float
    complete: bool = False


class WaitingReq(NamedTuple):
    """One request in SGLang's waiting queue (build one with `waiting_req`, which derives
    `sid` and `volatile` from the rid)."""

    rid: str
    prompt_len: int  # its input tokens (origin_input_ids)
    prefix_hit: int  # tokens SGLang last matched for it in the prefix cache
    max_new: int  # its output budget, clipped as SGLang clips it for admission
    entered: float  # when it entered SGLang's waiting queue
    borrowed: bool  # a stream turn that already runs on its session's KV row
    #: tokens of its matched prefix that no request has locked: evictable KV now, which its
    #: admission locks (SGLang's `PrefillAdder` counts them out of the free KV while it decides)
    prefix_free: int
    #: the stream the request is a turn of (`rid.stream_of`), "" for any other request: the
    #: adapter splits the rid once per request as it builds the snapshot, and the decisions'
    #: loops over the queue (the step's cost at 500 streams) then split no string
    sid: str
    volatile: bool  # a turn of a volatile tail (`rid.is_volatile`)
    #: a prefill turn of a stream (`rid.is_speculative`; speculative work while the stream's
    #: context is not final), split from the rid with `sid`
    speculative: bool


def waiting_req(
    rid: str,
    prompt_len: int,
    prefix_hit: int,
    max_new: int,
    entered: float,
    borrowed: bool,
    prefix_free: int = 0,
) -> WaitingReq:
    """A `WaitingReq`, its `sid`, `volatile` and `speculative` taken from `rid`."""
    sid, volatile, speculative = parts(rid)
    return WaitingReq(
        rid, prompt_len, prefix_hit, max_new, entered, borrowed, prefix_free, sid, volatile,
        speculative,
    )  # fmt: skip


class SlotView(NamedTuple):
    """A stream's session slot that holds KV (its committed and allocated tokens)."""

    sid: str
    committed: int
    allocated: int
    inflight: bool  # a turn of the stream is in flight (waiting or running)


class HostCopy(NamedTuple):
    """A stream's KV swapped out to the host pool."""

    sid: str
    size: int
    session_open: bool
    #: swapped in before (the tree may still hold it all): kept until the stream holds its
    #: slot, and swapped in again only for the next admission, for what the tree lost
    restored: bool = False


class Snapshot(NamedTuple):
    """SGLang's scheduler state at one step, as the decisions need it (KV in tokens)."""

    now: float
    waiting: tuple[WaitingReq, ...]
    slots: Mapping[str, SlotView]  # sid -> its slot, only slots holding KV
    #: KV free now: the allocator's free tokens plus what LRU eviction of the prefix cache can
    #: free, less what the running batch will still take (SGLang's own admission reserve)
    free_kv: int
    available: int  # the allocator's free tokens alone (swap-ins of non-head streams use it)
    chunked_next: int  # tokens of the mid-prefill request's next chunk (0: none)
    host: tuple[HostCopy, ...]
    host_free: int  # room left in the host pool, in tokens
    #: what SGLang's admission asks beyond the extend and the output budget, in tokens: a page
    #: of rounding, and 1 because it admits only below its free KV (`total < remaining`)
    admit_extra: int = 0
    #: scheduling steps in a row that admitted nothing while nothing ran, though a request
    #: was offered to the admission (not only held speculative turns; see `STALL_STEPS`)
    stalled: int = 0
    #: seconds since the engine stalled: nothing admitted, nothing running, requests waiting
    #: (held ones too); 0: not stalled (see `SPEC_STALL_S`)
    stalled_s: float = 0.0
    #: KV, in tokens, that speculative work leaves free for committed work: a speculative turn
    #: is admitted only into free KV beyond it (`hold`), and preempts for it only by swap
    spec_reserve: int = 0
    #: the rid of the request mid-prefill (SGLang's chunked request; "": none)
    chunked_rid: str = ""


class Preempt(NamedTuple):
    sid: str
    mode: Literal["recompute", "swap"]
    tokens: int  # the KV tokens it holds


class Actions(NamedTuple):
    """What one step decided, in the order the adapter applies it."""

    drop_copies: tuple[str, ...] = ()  # host copies to drop (counted as recompute)
    swap_in: tuple[str, ...] = ()  # streams whose host copy comes back
    preempt: tuple[Preempt, ...] = ()  # victims, lowest priority first
    shortfall: int = 0  # the KV the plan lacked (what the preemptions cover)
    planned: bool = False  # the plan step ran (KV held by preemptible streams was at stake)
    #: the preemptions were forced by a stall: the head fit the KV as counted here, yet
    #: SGLang admitted nothing for `STALL_STEPS` steps while nothing ran
    forced: bool = False
    #: the head the preemptions make room for is speculative work (after a stall too)
    for_speculative: bool = False


#: steps in a row with nothing admitted and nothing running after which the head is taken not
#: to fit, whatever the count says: KV that streams hold is then freed rather than waited for
#: (which nothing would end), lowest priority first, one victim's worth per stall
STALL_STEPS = 16

#: seconds a stall must last before speculative work is planned as committed work is (no
#: reserve, victims recomputed): a stall of held speculative work on an idle engine is the
#: reserve at work, not a fault, and ends when a stream finishes; it is lifted for a client
#: that waits for its context to be prefilled before it finishes (it would wait for ever).
#: After 1 s, lifts came 19-21 times per replay of memory-pressure-tails (a final context
#: comes every 2 s there), each letting speculative work take the reserve and recompute others.
SPEC_STALL_S = 5.0

_ALL = 1 << 62  # a shortfall no victims cover: `_victims` then returns every holder


NOTHING = Actions()


def record_turn(streams: Mapping[str, StreamInfo], rid: str, now: float) -> StreamInfo:
    """The stream's info once turn `rid` arrived (its last chunk's arrival; final or not)."""
    info = streams.get(stream_of(rid) or "")
    opened = info.opened if info is not None else now
    return StreamInfo(opened=opened, last_chunk=now, complete=is_final(rid))


def promote(streams: Mapping[str, StreamInfo], rid: str, now: float) -> StreamInfo:
    """The stream's info once its speculative turn `rid`, which cannot be cancelled, is
    promoted because the stream is finishing: its context is taken as final from `now` (the
    final turn waits for this one), so the turn ranks as committed work."""
    return record_turn(streams, rid, now)._replace(complete=True)


def _demoted(v: ReqView) -> bool:
    """A volatile tail (`rid.is_volatile`) that ranks after everything: one of a stream whose
    context is not final (a promoted one ranks as committed work)."""
    return is_volatile(v.rid) and not (v.is_stream and v.complete)


_new = tuple.__new__  # a ReqView from a field tuple, without NamedTuple's Python-level __new__


def waiting_views(snap: Snapshot, streams: Mapping[str, StreamInfo]) -> list[ReqView]:
    """One `ReqView` per waiting request, in the snapshot's order (see `views`)."""
    out: list[ReqView] = []
    append = out.append
    slots_get = snap.slots.get
    streams_get = streams.get
    for rid, prompt_len, prefix_hit, max_new, entered, borrowed, _, sid, _, _ in snap.waiting:
        info = streams_get(sid) if sid else None
        slot = slots_get(sid) if sid else None
        if slot is not None:
            held = slot.committed
            ev = slot.allocated if not borrowed else 0
        else:
            held = ev = 0
        hit = held if held > prefix_hit else prefix_hit
        pending = prompt_len - hit
        pending = (pending if pending > 1 else 1) + max_new
        if info is not None:
            v = (rid, True, info.complete, info.opened, info.last_chunk, held, pending)
        else:
            v = (rid, False, True, entered, entered, held, pending)
        append(_new(ReqView, v + ("waiting", False, ev)))
    return out


class _Idle(NamedTuple):
    """The idle streams of a snapshot (a slot holding KV with no turn in flight, of a stream
    the scheduler knows), without a view each: their slots and infos, and the KV they hold."""

    slots: list[SlotView]
    infos: list[StreamInfo]
    each: list[int]  # the KV preempting each frees (its slot's allocated tokens)
    kv: int  # the KV preempting all of them frees


_SLOT_SID = itemgetter(0)
_SLOT_HELD = itemgetter(1)  # SlotView.committed
_SLOT_KV = itemgetter(2)  # SlotView.allocated
_OPENED, _LAST_CHUNK, _COMPLETE = itemgetter(0), itemgetter(1), itemgetter(2)  # StreamInfo


def _idle(snap: Snapshot, streams: Mapping[str, StreamInfo]) -> _Idle:
    """The idle streams (`_Idle`), found in one comprehension and C-level passes over the
    slots (at 500 streams a view for each, as `_idle_views` builds them, cost as much as
    finding the head; the comprehension's filter costs less than three C passes of
    `compress`, `not_` and an itemgetter)."""
    slots = [s for s in snap.slots.values() if not s[3]]  # SlotView.inflight
    infos = list(map(streams.get, map(_SLOT_SID, slots)))
    if None in infos:  # slots of streams the scheduler does not know are not idle streams
        slots = list(compress(slots, infos))
        infos = [i for i in infos if i is not None]
    each = list(map(_SLOT_KV, slots))
    return _Idle(slots, infos, each, sum(each))


def _idle_view(slot: SlotView, info: StreamInfo) -> ReqView:
    return _new(ReqView, (slot[0], True, info[2], info[0], info[1], slot[1], 0, "idle", False,
                          slot[2]))  # fmt: skip


def _idle_views_of(idle: _Idle) -> list[ReqView]:
    return list(map(_idle_view, idle.slots, idle.infos))


def _idle_views(snap: Snapshot, streams: Mapping[str, StreamInfo]) -> list[ReqView]:
    """One `ReqView` per idle stream: a slot holding KV with no turn in flight (see `views`)."""
    return _idle_views_of(_idle(snap, streams))


def _idle_order(idle: _Idle, by: tuple[str, str], most: int = _ALL) -> Iterator[ReqView]:
    """The views of the idle streams that hold KV, lowest priority first (`_victims`' order
    of them), for a policy that ranks committed and speculative work by `by`
    (`ranks(policy)`), made lazily, without a view per stream or a sort of key tuples: the
    policy orders idle streams with a final context before the others, each by its class's
    rank then (arrival, rid) ("given": slot order), so the partial streams come first, then
    (rarely) the complete ones. A class's holders (usually every idle stream: slots hold KV,
    and few idle streams are complete) are sorted on the rank's key alone, a float or int
    sort in C several times faster than one of key tuples; the tuples decide only where the
    next view's key ties the one after. Only streams holding at most `most` tokens are
    taken (`_ALL`: any). tests/unit/test_decide.py checks `decide` against the general
    planner on random states."""
    slots, infos, holding = idle.slots, idle.infos, idle.each
    every = 0 not in holding and (most >= _ALL or max(holding, default=0) <= most)
    if every and True not in map(_COMPLETE, infos):
        classes = ((by[1], list(range(len(slots)))),)  # the usual case: one pass each, in C
    else:
        if not every:
            holding = [0 < h <= most for h in holding]
        complete = list(map(_COMPLETE, infos))
        classes = (
            (by[1], list(compress(range(len(slots)), map(mul, holding, map(not_, complete))))),
            (by[0], list(compress(range(len(slots)), map(mul, holding, complete)))),
        )
    for rank, take in classes:
        if len(take) < 2 or rank == "given":  # slot order: the last is the lowest
            while take:
                i = take.pop()
                yield _idle_view(slots[i], infos[i])
            continue
        every = len(take) == len(slots)  # the class's items are the slots, in order
        if rank == "held":  # most first: the lowest priority holds the least
            key = list(map(_SLOT_HELD, slots if every else map(slots.__getitem__, take)))
        else:
            field = _OPENED if rank == "arrival" else _LAST_CHUNK
            key = list(map(field, infos if every else map(infos.__getitem__, take)))
        # the lowest priority last (a stable sort: the reverse keeps ties in given order)
        order = sorted(range(len(take)), key=key.__getitem__, reverse=rank == "held")
        while order:
            if len(order) > 1 and key[order[-1]] == key[order[-2]]:
                tie = _tied(key, order)  # (arrival, rid) decides it, as in the policies' order
                order[tie:] = sorted(
                    order[tie:], key=lambda k: (infos[take[k]][0], slots[take[k]][0])
                )
            i = take[order.pop()]
            yield _idle_view(slots[i], infos[i])


def _upto(victims: Iterable[ReqView], shortfall: int) -> list[ReqView]:
    """The first of `victims` whose reclaimable KV covers `shortfall` (all if they do not)."""
    out: list[ReqView] = []
    freed = 0
    if shortfall > 0:
        for v in victims:  # (a view past the last one needed is not made)
            out.append(v)
            freed += v[9]  # ReqView.reclaimable_kv
            if freed >= shortfall:
                break
    return out


def _idle_victims(idle: _Idle, by: tuple[str, str], shortfall: int) -> list[ReqView]:
    """`_victims` of the idle streams' views (`_idle_order`) for a policy that ranks by `by`."""
    return _upto(_idle_order(idle, by), shortfall)


def _tied(key: list, order: list[int]) -> int:
    """Where the run of `order`'s last keys equal to its last one starts."""
    last, j = key[order[-1]], len(order) - 1
    while j and key[order[j - 1]] == last:
        j -= 1
    return j


def roomy(snap: Snapshot) -> bool:
    """The KV pool holds all the waiting work at once: every waiting request's extend past its
    prefix hit, output budget and locked prefix (`WaitingReq.prefix_free`), the mid-prefill
    request's next chunk, the admission's extra and the speculative reserve fit the free KV
    together, no stream's KV is on the host and the engine has not stalled. Then no order
    of the queue makes anyone wait for KV, and `decide` preempts nothing whichever request
    is the head. Exits at the first request past the free KV (a step under pressure, the
    dear one at 500 streams, stops early)."""
    if snap.host or snap.stalled or snap.stalled_s:
        return False
    room = snap.free_kv - snap.chunked_next - snap.admit_extra - snap.spec_reserve
    for w in snap.waiting:
        room -= w[1] - w[2] + w[3] + w[6]  # prompt_len - prefix_hit + max_new + prefix_free
        if room < 0:
            return False
    return room >= 0


def in_force(policy: Policy, snap: Snapshot) -> Policy:
    """The policy that orders this step: `policy`, or the one it names as `Policy.roomy`
    while the KV pool holds all the waiting work (`roomy`). Idempotent: the policy in force
    names none, or is `policy` itself because the pool lacks room."""
    name = policy.roomy
    if name is None or not roomy(snap):
        return policy
    return get_policy(name)


def ranks(policy: Policy) -> tuple[str, str] | None:
    """How `policy` ranks committed and speculative work (`Policy.rank`, `Policy.spec_rank`),
    or None if only its `order` knows."""
    if not policy.rank:
        return None
    return policy.rank, policy.spec_rank or policy.rank


def views(snap: Snapshot, streams: Mapping[str, StreamInfo]) -> list[ReqView]:
    """One `ReqView` per waiting request and per idle stream (a slot with no turn in flight).

    A waiting turn that has not borrowed its slot yet can be preempted like an idle stream
    (its next admission re-matches from the tree); one that has, cannot. A plain request keeps
    the time it entered SGLang's queue, so it is never overtaken for ever by later work of its
    own class. Its KV need is what SGLang's admission asks: the extend past its prefix hit (or
    past what its stream's slot holds) plus its clipped output budget.
    """
    return waiting_views(snap, streams) + _idle_views(snap, streams)


def needs_order(rids: list[str], keep_sglang_order: bool) -> bool:
    """Whether waiting requests `rids` need our order at all: two or more, and, keeping
    SGLang's order within each class, a speculative turn among them."""
    if len(rids) < 2:
        return False
    return not keep_sglang_order or any(is_speculative(r) for r in rids)


def _committed_first(order: list[ReqView]) -> list[str]:
    """The rids of `order` with volatile tails (`_demoted`) moved after everything else."""
    rids = [v.rid for v in order]
    demoted = list(map(_demoted, order))
    if not any(demoted):
        return rids
    return list(compress(rids, map(not_, demoted))) + list(compress(rids, demoted))


def decide_order(
    snap: Snapshot,
    streams: Mapping[str, StreamInfo],
    policy: Policy,
    keep_sglang_order: bool,
    views_: Sequence[ReqView] | None = None,
) -> tuple[str, ...] | None:
    """The waiting queue's order, or None to leave SGLang's.

    Under every policy committed work (plain requests, final turns) goes before speculative
    work (prefill turns of contexts not yet final), and volatile tails (update mode: what the
    last refinement rewrote, `rid.is_volatile`) after everything, so speculative turns get only
    the budget left over. `keep_sglang_order` (the `default` policy): SGLang's order within
    each class, and nothing to do while no speculative turn waits. `views_`:
    `waiting_views(snap, streams)`, if the caller has them (`hold` and `cap_step` use them)."""
    if not needs_order([w.rid for w in snap.waiting], keep_sglang_order):
        return None
    views_ = list(views_) if views_ is not None else waiting_views(snap, streams)
    return tuple(_committed_first(in_force(policy, snap).order(views_)))


def _head(policy: Policy, waiting: list[ReqView]) -> ReqView:
    """The next admission: the first of `decide_order`'s order (volatile tails last)."""
    order = policy.order(waiting)
    return next((v for v in order if not _demoted(v)), order[0])


def decide(
    snap: Snapshot,
    streams: Mapping[str, StreamInfo],
    policy: Policy,
    preemption: Preemption | None,
) -> Actions:
    """Drops, swap-ins and preemptions for one step (see the module docstring).

    `preemption` None: no preemption mode is set up yet (nothing is preempted). A swap-in is
    assumed to take its copy's size from the allocator's free tokens (the tree may still hold
    part of it); the copy becomes prefix cache that the stream's waiting turn will match.

    The policy is the one in force this step (`in_force`: `Policy.roomy`'s while the KV pool
    holds all the waiting work; then the head fits whichever it is, and nothing is preempted).
    The plan is that of one admission, the policy's next (`_head`), with a token budget of
    what SGLang's admission asks for it: its extend and output budget, `admit_extra`, and the
    evictable part of its matched prefix (`prefix_free`: its admission locks it, so that KV
    is not free for it; leaving it out once let a head that "fit" wait for ever beside idle
    streams). It is granted what fits in the free KV plus the KV of every other holder, and
    the victims are those holders, idle streams first, each class lowest priority first
    (`planner.plan`'s order, which tests/unit/test_decide.py checks this against on random
    snapshots). When even that cannot make room for the head, nothing is preempted: it waits
    for KV that running requests release. After `STALL_STEPS` steps that admitted nothing
    while nothing ran, a head that fits by this count is taken to lack one token (`forced`),
    so one victim's KV is freed per stall.

    A speculative head (a stream turn whose context is not final) asks `spec_reserve` more
    (speculative KV leaves that much free for committed work, as `hold` keeps it) and gets
    only swaps: its victims, in the same order, are those the `Preemption` would swap into
    the host pool less `spec_reserve` (kept free for a later committed head's victims), up to
    its shortfall; when they cannot cover it, nothing is preempted and it waits (`hold`
    keeps it out of the admission; its stream's finish promotes or replaces it), unless the
    engine has stalled long enough (`lifted`): then it is planned as committed work is. The
    motive: preempting idle streams by recompute for speculative work let streams evict one
    another's KV in turn under memory pressure, and speculative KV that filled the pool made
    every final turn preempt (recompute) another stream's.

    Cost: for a policy that says how it ranks (`ranks`, every built-in one) the head is
    found in one pass over the queue (`_head_index`), without a view per request or a sort;
    other policies order the waiting requests' views. The holders are looked at only when the
    head lacks KV, and then only the idle streams when their KV covers the shortfall (they are
    the first victims; for a policy with a `rank`, by a sort of one key per stream in C and a
    view for each victim only: `_idle_order`), else those and the waiting turns that hold KV
    (`_holders`), whose views are built and ordered only if the idle streams do not do
    (`_later_victims`). A speculative head takes no victim larger than the host room left, so
    those are never ordered. It relies on a policy ordering any subset as it orders the
    whole, as the sort-based built-in ones do."""
    drop = tuple(c.sid for c in snap.host if not c.session_open or c.sid in snap.slots)
    if not snap.waiting:
        return Actions(drop_copies=drop) if drop else NOTHING
    copies = {c.sid: c for c in snap.host if c.sid not in drop}
    policy = in_force(policy, snap)
    by = ranks(policy)
    hi = _head_index(snap, streams, by) if by else None
    if hi is None:
        waiting = waiting_views(snap, streams)
        first = _head(policy, waiting)
        hi = waiting.index(first)
    else:
        first = _view_at(snap, streams, hi)

    swap_in: list[str] = []
    if copies:
        available = snap.available
        for w in snap.waiting:
            sid = w.sid
            copy = copies.get(sid) if sid else None
            if copy is None or sid in swap_in:
                continue
            if w.rid != first.rid and (copy.restored or available < copy.size):
                continue
            swap_in.append(copy.sid)
            available = max(0, available - copy.size)  # the head's evicts LRU cache for room
        if swap_in:
            # The copy goes into the prefix cache (evictable, so free_kv stays as it is),
            # where the turn's own match finds it; its admission will lock it.
            back = {s: copies[s].size for s in swap_in}
            hits = tuple(_with_copy(w, back.get(w.sid, 0)) for w in snap.waiting)
            snap = snap._replace(waiting=hits)
            first = _view_at(snap, streams, hi)
    done = Actions(drop, tuple(swap_in)) if drop or swap_in else NOTHING
    if preemption is None:
        return done
    free_kv = max(0, snap.free_kv - snap.chunked_next)  # mid-prefill: its next chunk first
    # Speculative work (a turn of a context not final, not promoted) never throws another
    # stream's KV away, and leaves `spec_reserve` free: its victims are swapped, lowest
    # priority first, and only if swaps cover its shortfall. Not after a long stall
    # (`lifted`): then the KV is idle, and a client that waits for its context to be
    # prefilled before it finishes would otherwise wait for ever.
    head_speculative = is_speculative(first.rid) and not first.complete
    speculative = head_speculative and not lifted(snap)
    # what speculative work leaves free, of the KV pool and of the host pool alike: a
    # committed head that comes later can then swap its victim out rather than recompute it
    reserve = snap.spec_reserve if speculative else 0
    # What SGLang's admission of the head asks: its extend and output budget, a page, the
    # strict test, and the evictable part of its prefix (locked while it is admitted).
    need = first.pending + snap.admit_extra + snap.waiting[hi].prefix_free + reserve
    forced = need <= free_kv and snap.stalled >= STALL_STEPS
    if forced:
        need = free_kv + 1  # the count was wrong somewhere: free one victim's KV
    elif need <= free_kv:  # it fits: no idle stream needs looking at
        return done._replace(planned=True) if _at_stake(snap, streams) else done
    host_free = snap.host_free + sum(copies[s].size for s in swap_in)
    idle = _idle(snap, streams)
    if free_kv + idle.kv >= need and not speculative:
        # Idle streams alone make room, and they are the first victims (`_victims`): the
        # waiting requests' views are not needed, nor, for a policy that says how it ranks,
        # the idle streams' own (`_idle_victims`)
        shortfall = need - free_kv
        if by:
            victims = _idle_victims(idle, by, shortfall)
        else:
            victims = _victims(policy, _idle_views_of(idle), shortfall)
    else:
        # the other waiting requests that hold KV a preemption frees (turns not on their
        # slot yet): only they can be victims, so only their views are built
        holders = list(_holders(snap, hi))
        slots = snap.slots
        reclaimable = sum(slots[w[7]][2] for w in holders) + idle.kv  # (their views' KV)
        if not reclaimable and not first.reclaimable_kv:
            return done
        cap = free_kv + reclaimable  # all the KV the head could have
        shortfall = min(need, cap) - free_kv  # <= 0 also when cap <= 0: no victim helps
        if shortfall <= 0 or (speculative and need > cap):  # (swaps would not admit it)
            return done._replace(planned=True)
        if by:  # the idle streams first (`_victims`' order), the waiting turns only if needed
            if speculative:  # it takes victims until swaps cover its need; a `Preemption`
                # swaps only what fits the host room, so a larger victim is never taken
                most = host_free - reserve
                victims: Iterable[ReqView] = chain(
                    _idle_order(idle, by, most),
                    _later_victims(snap, streams, policy, holders, most),
                )
            else:
                victims = _upto(
                    chain(_idle_order(idle, by), _later_victims(snap, streams, policy, holders)),
                    shortfall,
                )
        else:
            held = waiting_views(snap._replace(waiting=tuple(holders)), streams)
            victims = _victims(
                policy, held + _idle_views_of(idle), _ALL if speculative else shortfall
            )
    preempt: list[Preempt] = []
    freed = 0
    for view in victims:
        sid = view.rid if view.state == "idle" else stream_of(view.rid)
        if not view.reclaimable_kv or sid is None or sid not in snap.slots:
            continue
        mode = preemption.decide(view.reclaimable_kv, host_free - reserve)
        if speculative and mode != "swap":
            continue
        if mode == "swap":
            host_free -= view.reclaimable_kv
        preempt.append(Preempt(sid, mode, view.reclaimable_kv))
        freed += view.reclaimable_kv
        if speculative and freed >= shortfall:
            break
    if speculative and freed < shortfall:
        preempt = []  # it waits for KV that committed work releases (or for its finish)
    return Actions(
        drop, tuple(swap_in), tuple(preempt), shortfall, True, forced and bool(preempt),
        head_speculative and bool(preempt),
    )  # fmt: skip


def lifted(snap: Snapshot) -> bool:
    """The engine has stalled long enough (`SPEC_STALL_S` seconds with nothing admitted while
    nothing ran) for speculative work to be planned as committed work is: no reserve, and
    victims recomputed where they cannot be swapped."""
    return snap.stalled_s >= SPEC_STALL_S


def hold(
    snap: Snapshot,
    streams: Mapping[str, StreamInfo],
    order: Sequence[str] | None = None,
    views_: Sequence[ReqView] | None = None,
) -> tuple[str, ...]:
    """The speculative turns to keep out of this step's admission, so that speculative KV
    leaves `snap.spec_reserve` tokens free for committed work (final turns, plain requests).

    Walking the waiting queue in `order` (rids; None: the snapshot's), as SGLang's admission
    does, the budget is the free KV less the chunked request's next chunk and the reserve;
    committed work is charged what its admission asks, and a speculative turn (a turn of a
    context not final, volatile tails included) that does not fit in what is left is held,
    one that fits is charged. A speculative turn is charged its whole context beyond what
    its stream's slot holds, its prefix hit included: its admission locks that prefix
    (evictable KV, counted free), and SGLang's last match may predate the swap-in of the
    stream's host copy (counting only the hit SGLang reported let such turns take the
    reserve). Nothing is held without a reserve or after a long stall
    (`lifted`: as `decide` then plans speculative work as committed). A held turn waits in
    the queue; `decide`'s swaps, a stream's finish (its turns are promoted or replaced), or
    KV that committed work releases let it in later."""
    if snap.spec_reserve <= 0 or lifted(snap):
        return ()
    if views_ is None:  # `waiting_views(snap, streams)`, which the caller may share
        views_ = waiting_views(snap, streams)
    by_rid = {v.rid: (v, w) for v, w in zip(views_, snap.waiting, strict=True)}
    budget = snap.free_kv - snap.chunked_next - snap.spec_reserve
    held: list[str] = []
    for rid in order if order is not None else by_rid:
        entry = by_rid.get(rid)
        if entry is None:
            continue
        view, w = entry
        if w[9] and not view.complete:  # WaitingReq.speculative: speculative work
            need = max(w.prompt_len - view.held, 1) + w.max_new + snap.admit_extra
            if need > budget:
                held.append(rid)
                continue
        else:
            need = view.pending + snap.admit_extra + w.prefix_free
        budget -= need
    return tuple(held)


def is_speculative_work(rid: str, streams: Mapping[str, StreamInfo]) -> bool:
    """A prefill turn of a stream whose context is not final (a turn of a stream the
    scheduler does not know, or one already promoted, ranks as committed work)."""
    if not is_speculative(rid):
        return False
    info = streams.get(stream_of(rid) or "")
    return info is not None and not info.complete


def cap_step(
    snap: Snapshot,
    streams: Mapping[str, StreamInfo],
    limit: int,
    order: Sequence[str] | None = None,
    skip: frozenset[str] | set[str] = frozenset(),
    views_: Sequence[ReqView] | None = None,
) -> tuple[str, ...]:
    """The speculative turns to keep out of this step's admission so that the step prefills
    at most `limit` speculative tokens (`speculative_chunk`): a committed request that arrives
    while a step runs then waits for at most that much speculative work, however many
    streams have turns waiting (each turn is at most `limit` tokens, but SGLang would batch
    several up to its whole `chunked_prefill_size`; on a CPU a step's time grows with each
    token in it).

    Walking the waiting queue in `order` (rids; None: the snapshot's), as SGLang's admission
    does, and leaving out `skip` (turns already held), a speculative turn is charged the
    tokens it would prefill (its prompt beyond its slot's tokens or its prefix hit, at least
    1); the mid-prefill request's next chunk is charged first when it is speculative. The
    first speculative turn is always let in when nothing speculative runs yet, so speculative
    work always progresses. Committed work is not charged: it never waits for the cap.
    `views_`: `waiting_views(snap, streams)`, if the caller has them (`hold` uses the same)."""
    if limit <= 0:
        return ()
    chunked = snap.chunked_rid
    used = snap.chunked_next if chunked and is_speculative_work(chunked, streams) else 0
    # the views `hold` and the order use: a turn's class, and its pending tokens (its prompt
    # beyond its slot's tokens or its prefix hit, at least 1) plus its output budget
    by_rid = {
        v.rid: v.pending - w.max_new
        for v, w in zip(views_ or waiting_views(snap, streams), snap.waiting, strict=True)
        if w[9] and v.is_stream and not v.complete  # WaitingReq.speculative
    }
    held: list[str] = []
    for rid in order if order is not None else by_rid:
        tokens = by_rid.get(rid)
        if tokens is None or rid in skip:
            continue
        if used and used + tokens > limit:
            held.append(rid)
            continue
        used += tokens
    return tuple(held)


#: seconds a committed request's KV need keeps the automatic reserve up after it was last seen
#: waiting (`RecentMax`): one large request once served does not throttle speculative work for
#: good, and a workload of large requests keeps the reserve as long as they keep coming
RESERVE_WINDOW_S = 60.0


class RecentMax:
    """The largest value observed in the last `window` seconds (the automatic reserve: the
    largest committed need seen recently). A deque of (time, value) with values decreasing
    from the front, so each observation and each read costs O(1) amortised and the deque
    holds only values that can still become the maximum."""

    def __init__(self, window: float = RESERVE_WINDOW_S) -> None:
        self.window = window
        self._q: deque[tuple[float, int]] = deque()

    def observe(self, now: float, value: int) -> None:
        """Value `value` seen at time `now` (times never decrease; a value <= 0 is ignored)."""
        if value <= 0:
            return
        q = self._q
        while q and q[-1][1] <= value:
            q.pop()
        q.append((now, value))

    def value(self, now: float) -> int:
        """The largest value observed in (`now` - window, `now`]; 0 if none."""
        q = self._q
        while q and q[0][0] <= now - self.window:
            q.popleft()
        return q[0][1] if q else 0


def committed_need(snap: Snapshot, streams: Mapping[str, StreamInfo]) -> int:
    """The most KV a committed waiting request (a plain one, or a turn of a stream whose
    context is final, or of a stream the scheduler does not know: `is_speculative_work`'s
    classes, which `cap_step` and the order use) would ask with no prefix cached: its prompt
    and output budget."""
    most = 0
    streams_get = streams.get
    for w in snap.waiting:
        if w[9]:  # WaitingReq.speculative: a prefill turn, speculative work unless promoted
            info = streams_get(w[7])
            if info is not None and not info[2]:
                continue
        need = w[1] + w[3]  # its prompt and output budget
        if need > most:
            most = need
    return most


def _holders(snap: Snapshot, skip: int = -1) -> Iterator[WaitingReq]:
    """The waiting requests but `snap.waiting[skip]` whose view has reclaimable KV: stream
    turns not on their slot yet whose slot holds KV (`waiting_views`' `reclaimable_kv`)."""
    slots_get = snap.slots.get
    for i, w in enumerate(snap.waiting):
        if w[5] or i == skip:  # WaitingReq.borrowed
            continue
        slot = slots_get(w[7]) if w[7] else None  # WaitingReq.sid
        if slot is not None and slot[2]:  # SlotView.allocated
            yield w


def _view_at(snap: Snapshot, streams: Mapping[str, StreamInfo], i: int) -> ReqView:
    """The view of waiting request `i` (as `waiting_views` builds it)."""
    return waiting_views(snap._replace(waiting=(snap.waiting[i],)), streams)[0]


def _head_index(
    snap: Snapshot, streams: Mapping[str, StreamInfo], by: tuple[str, str]
) -> int | None:
    """`_head`'s choice as an index in `snap.waiting`, found in one pass without views or a
    sort, for a policy that ranks committed and speculative work by `by` (`ranks(policy)`):
    the best committed request (a plain one, or a turn of a stream whose context is final),
    else the best speculative one, volatile tails (`_demoted`) left out; None if only they
    wait. tests/unit/test_decide.py checks it against `_head` on random snapshots.

    The loop is the step's cost at 500 streams (bench/micro_plan.py --step decide): it keeps
    each class's best as two scalars and breaks a tie of the primary key (`_before`) only
    when one occurs."""
    if by[0] == "given":
        return _first_given(snap, streams)
    streams_get = streams.get
    slots_get = snap.slots.get
    waiting = snap.waiting
    # per class (committed, speculative): StreamInfo.last_chunk, else .opened; or held tokens
    c_field = 1 if by[0] == "last_chunk" else 0
    s_field = 1 if by[1] == "last_chunk" else 0
    c_held, s_held = by[0] == "held", by[1] == "held"  # most first
    c_key = s_key = _INF  # the best key so far, committed and speculative
    c_i = s_i = -1
    # speculative turns ranked by held tokens: their slots are looked up only when no
    # committed request waits (the speculative key matters only then)
    deferred: list[int] = []
    for i, w in enumerate(waiting):
        sid = w[7]  # WaitingReq.sid, .volatile, .entered by index: this loop is the cost
        info = streams_get(sid) if sid else None
        if info is None:
            if w[8]:
                continue  # a volatile tail (`_demoted`)
            key = w[4]
        elif info[2]:
            key = info[c_field]
        elif w[8]:
            continue
        elif s_held:
            deferred.append(i)
            continue
        else:
            key = info[s_field]
            if key < s_key or (key == s_key and _before(snap, streams, i, s_i)):
                s_key, s_i = key, i
            continue
        if c_held:
            slot = slots_get(sid) if sid else None
            key = -slot[1] if slot is not None else 0
        if key < c_key or (key == c_key and _before(snap, streams, i, c_i)):
            c_key, c_i = key, i
    if c_i >= 0:
        return c_i
    for i in deferred:
        slot = slots_get(waiting[i][7])
        key = -slot[1] if slot is not None else 0
        if key < s_key or (key == s_key and _before(snap, streams, i, s_i)):
            s_key, s_i = key, i
    return None if s_i < 0 else s_i


_INF = float("inf")


def _first_given(snap: Snapshot, streams: Mapping[str, StreamInfo]) -> int | None:
    """`_head_index` for rank "given": the first committed request, else the first
    speculative one, volatile tails left out."""
    first_speculative = None
    for i, w in enumerate(snap.waiting):
        info = streams.get(w.sid) if w.sid else None
        if info is None or info[2]:
            if info is None and w.volatile:
                continue
            return i
        if first_speculative is None and not w.volatile:
            first_speculative = i
    return first_speculative


def _before(snap: Snapshot, streams: Mapping[str, StreamInfo], i: int, j: int) -> bool:
    """Waiting request `i` goes before `j` on the policies' tie-break: arrival (a stream's
    opening, a plain request's queue entry), then rid. True if `j` < 0 (none yet)."""
    if j < 0:
        return True

    def key(n: int) -> tuple[float, str]:
        w = snap.waiting[n]
        info = streams.get(w.sid) if w.sid else None
        return (w.entered if info is None else info[0], w.rid)

    return key(i) < key(j)


def _at_stake(snap: Snapshot, streams: Mapping[str, StreamInfo]) -> bool:
    """Some KV could be reclaimed by preemption: an idle stream's, or that of a waiting turn
    that has not borrowed its slot (what `planned` reports)."""
    if any(s.allocated and not s.inflight and s.sid in streams for s in snap.slots.values()):
        return True
    return next(_holders(snap), None) is not None


def _with_copy(w: WaitingReq, size: int) -> WaitingReq:
    """Waiting request `w` once a host copy of `size` tokens of its stream is back in the
    prefix cache: its match covers the copy, which is evictable (its locked part, a prefix of
    the match, stays as it was)."""
    if size <= w.prefix_hit:
        return w
    return w._replace(prefix_hit=size, prefix_free=size - (w.prefix_hit - w.prefix_free))


def _later_victims(
    snap: Snapshot,
    streams: Mapping[str, StreamInfo],
    policy: Policy,
    holders: list[WaitingReq],
    most: int = _ALL,
) -> Iterator[ReqView]:
    """`_victims`' order of the waiting turns `holders` (`_holders`: they hold KV; victims
    after every idle stream) that hold at most `most` tokens, their views built and ordered
    only once a victim among them is asked for."""
    held = waiting_views(snap._replace(waiting=tuple(holders)), streams)
    yield from _victims(policy, [v for v in held if v[9] <= most], _ALL)


def _victims(policy: Policy, others: list[ReqView], shortfall: int) -> list[ReqView]:
    """The fewest of `others` holding KV, in preemption order (those without work first, then
    the rest, each lowest priority first), whose KV covers `shortfall` (all if none do)."""
    holders = policy.order([v for v in others if v.reclaimable_kv])
    holders.reverse()
    idle = [v for v in holders if not (v.pending or v.decoding)]
    if idle and len(idle) < len(holders):
        holders = idle + [v for v in holders if v.pending or v.decoding]
    out: list[ReqView] = []
    freed = 0
    for v in holders:
        out.append(v)
        freed += v.reclaimable_kv
        if freed >= shortfall:
            break
    return out


def may_cancel(snap: Snapshot, rid: str) -> bool:
    """A stale speculative turn `rid` may be aborted: it waits and has not borrowed its
    session's KV row. (SGLang drops the slot of an aborted turn that holds it, and the stream
    would recompute its whole context; a running turn is left to finish.)"""
    if not is_speculative(rid):
        return False
    return any(w.rid == rid and not w.borrowed for w in snap.waiting)
