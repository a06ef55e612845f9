"""Scheduling policies: each orders the request snapshots of one step, highest priority first.

A policy is one class registered by name; `policy_names()` feeds CLI `choices`. The built-in
orders are total and deterministic: ties are broken by arrival, then by rid, so equal snapshots
give equal plans whatever order they come in (`default` excepted: it keeps the given order). All
four list the requests with work this step (a decode step, or something to prefill) before those
without (idle partial streams), which makes idle streams the first preemption victims and grants
nothing differently.

Sorting uses stable sorts on single fields, least significant key first: several times cheaper
than tuple keys at 500 requests. The rid sort (string compares, the dearest) runs only when two
requests share an arrival time; otherwise arrival already decides every tie.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import ClassVar

from s2l_sglang.registry import Registry
from s2l_sglang.sched.snapshot import ReqView

_F = ReqView._fields  # getters by index: faster than attrgetter on a NamedTuple
_RID = itemgetter(_F.index("rid"))
_ARRIVAL = itemgetter(_F.index("arrival"))
_LAST_CHUNK = itemgetter(_F.index("last_chunk"))
_HELD = itemgetter(_F.index("held"))


class Policy:
    """Orders requests; `plan()` grants tokens in this order and preempts roughly in reverse
    (see `Plan.victims`). A new policy: subclass, implement `order`, decorate with `register`."""

    name: ClassVar[str] = ""
    #: True if `order` ranks every request without work (not decoding, nothing pending) after
    #: all requests with work; `plan` then derives the preemption order more cheaply.
    idle_last: ClassVar[bool] = False
    #: how `order` ranks the requests within each class of work (committed work only, if
    #: `spec_rank` is set), if it is one of these (it lets `sched.decide` find the next
    #: admission in one pass, without views or a sort): "given" (the input order), "arrival",
    #: "last_chunk" (earliest first) or "held" (most first), each with ties broken by
    #: arrival, then rid ("given" excepted). None: only `order` knows.
    rank: ClassVar[str | None] = None
    #: how `order` ranks speculative work (partial streams), if not as `rank` ranks committed
    #: work (one of the same names; not "given")
    spec_rank: ClassVar[str | None] = None
    #: the registered policy this one orders as while the KV pool holds all the waiting work
    #: at once (`sched.decide.roomy`), if another: a policy whose order is about spending
    #: scarce KV then orders for time to first token alone. None: this one, always.
    roomy: ClassVar[str | None] = None

    def order(self, views: Sequence[ReqView]) -> list[ReqView]:
        """All `views`, highest priority first, as a new list (the input is not modified)."""
        raise NotImplementedError


_POLICIES: Registry[type[Policy]] = Registry("policy")


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator: make a `Policy` subclass selectable as `name`."""
    return _POLICIES.register(name)


def policy_names() -> list[str]:
    """Registered policy names, in registration order (for CLI `choices`)."""
    return _POLICIES.names()


def get_policy(name: str) -> Policy:
    """A new instance of the policy registered as `name`."""
    return _POLICIES.get(name)()


def _split(views: list[ReqView], by_complete: bool) -> list[list[ReqView]]:
    """Groups in rank order: [work] + [idle], or with `by_complete`
    [complete work, partial work, complete idle, partial idle]. Keeps the input order in each."""
    if not by_complete:
        work: list[ReqView] = []
        idle: list[ReqView] = []
        for v in views:
            (work if v.pending or v.decoding else idle).append(v)
        return [work, idle]
    cw: list[ReqView] = []
    pw: list[ReqView] = []
    ci: list[ReqView] = []
    pi: list[ReqView] = []
    for v in views:
        if v.pending or v.decoding:
            (cw if v.complete else pw).append(v)
        else:
            (ci if v.complete else pi).append(v)
    return [cw, pw, ci, pi]


def _by_arrival(views: Sequence[ReqView]) -> list[ReqView]:
    """Sorted by arrival, ties by rid (the rid sort only when an arrival time repeats)."""
    arrivals = set(map(_ARRIVAL, views))
    out = sorted(views, key=_RID) if len(arrivals) < len(views) else list(views)
    out.sort(key=_ARRIVAL)
    return out


def _committed_by_last_chunk(groups: list[list[ReqView]]) -> list[list[ReqView]]:
    """`_split(..., by_complete=True)`'s groups with committed work (complete work, complete
    idle) sorted by when its TTFT clock started (`last_chunk`), stably: ties keep the order
    given."""
    for g in groups[0::2]:
        g.sort(key=_LAST_CHUNK)
    return groups


def _concat(groups: list[list[ReqView]]) -> list[ReqView]:
    out = groups[0]
    for g in groups[1:]:
        out += g
    return out


@register("default")
class DefaultPolicy(Policy):
    """SGLang's own order: the order the integrator passes (running batch, then its waiting
    queue as SGLang's `--schedule-policy` sorted it), kept as is within each class of work:
    committed (complete contexts: plain requests, final turns) before speculative (partial
    streams), so speculative prefill only takes what committed work leaves. Requests with no
    work this step are listed after them, in the given order: that changes no grant (they
    get none), it only makes them the first victims and lets the planner use its cheaper
    path."""

    idle_last = True
    rank = "given"

    def order(self, views: Sequence[ReqView]) -> list[ReqView]:
        return _concat(_split(list(views), by_complete=True))


@register("fcfs")
class FcfsPolicy(Policy):
    """First come, first served, complete-context requests before partial streams. Speculative
    work (partial streams) by stream arrival (the first chunk); committed work (final contexts,
    plain requests) by when its request to generate came: when the context became final
    (`last_chunk`), a plain request's queue entry, the order waiting for the full context
    serves them in. Ranked by stream arrival (the paper's FCFS), a final context waited
    behind each older stream whose context became final after it: the slowest final of two
    crawler replays at 0.4 QPS took 8.1 s and 9.7 s (waiting: 4.8 s and 2.4 s for the same
    query), overtaken so by 2 and 4 streams (bench/results/crawler-r2-fcfs-mcps-382eb1a,
    crawler-r1-1ee4300; a p99 pooled over three replays is about the fourth-slowest final,
    so two such finals move it). Keys: committed (no work, last_chunk, arrival, rid),
    speculative (no work, arrival, rid)."""

    idle_last = True
    rank = "last_chunk"
    spec_rank = "arrival"

    def order(self, views: Sequence[ReqView]) -> list[ReqView]:
        return _concat(_committed_by_last_chunk(_split(_by_arrival(views), by_complete=True)))


@register("lcas")
class LcasPolicy(Policy):
    """Last-chunk-arrival scheduling: EARLIEST last chunk first, complete before partial.
    Key: (no work, partial, last_chunk, arrival, rid).

    Why earliest first (ascending), not freshest first:
      - For a complete request, `last_chunk` is when its context became final, which is when its
        TTFT clock started. Ascending is FCFS on the TTFT clock: the request that has waited
        longest for its first token goes first. Freshest-first would be LIFO on that clock and
        starve the oldest complete requests under load, exactly where P95/P99 TTFT is decided.
      - For a partial stream, `last_chunk` is the age of its newest unprefilled data. Ascending
        clears the oldest backlog first, so when a final chunk lands, the remaining prefill (which
        is all of that stream's TTFT) is small. A stream quiet for longest is also the likeliest
        to get its next (possibly final) chunk soon: inter-chunk gaps are bounded in practice
        (crawler median 0.7 s, P95 3 s); one that just got a chunk is furthest from its next.
      - It is the order the artifact's code sorts by (its docstring's "most recent first"
        disagrees with its own `sort(key=last_chunk_arrival_time)`), so it is the order behind
        the paper's measured LCAS results.
    Unlike FCFS, a stream that started early but just received a chunk yields to one whose
    context has been waiting longer."""

    idle_last = True
    rank = "last_chunk"

    def order(self, views: Sequence[ReqView]) -> list[ReqView]:
        ordered = _by_arrival(views)
        ordered.sort(key=_LAST_CHUNK)
        return _concat(_split(ordered, by_complete=True))


@register("mcps")
class McpsPolicy(Policy):
    """Most computed (held) tokens first among speculative work: the partial stream closest to
    done, and the most expensive to preempt, keeps going, so the KV pool is spent on finishing
    a few streams' prefill rather than spread over many. That is a rule for scarce KV: while
    the pool holds all the waiting work at once (`sched.decide.roomy`), mcps orders as `lcas`
    (oldest unprefilled chunk first). Ranked by held tokens with KV to spare, the streams that
    held most took every step's speculative budget and young ones finished with their whole
    context left: on the crawler row at 0.4 QPS (no preemption in either replay) mcps was
    0.91x of waiting at p50 in two replays (bench/results/crawler-r1-1ee4300,
    crawler-r2-fcfs-mcps-382eb1a), lcas 1.02x in the first run and 1.27x in its own replay
    at the second's commit (crawler-r2-lcas-382eb1a). Committed work (plain requests, final
    turns) goes first, as under every policy (the paper's MCPS has no such split; speculative
    work must not delay final contexts), and in the order its TTFT clock started (earliest
    last chunk first, as under `lcas`): ranked by held tokens, a final context that holds no
    KV was overtaken by each later one that did, and under memory pressure two finals of a
    burst waited 11-13 s where waiting for the full context took 3-7 s
    (bench/results/memory-pressure-tails-5846a70). Keys: committed (no work, last_chunk,
    arrival, rid), speculative (no work, -held, arrival, rid)."""

    idle_last = True
    rank = "last_chunk"
    spec_rank = "held"
    roomy = "lcas"

    def order(self, views: Sequence[ReqView]) -> list[ReqView]:
        groups = _committed_by_last_chunk(_split(_by_arrival(views), by_complete=True))
        for g in groups[1::2]:  # speculative: partial work, partial idle
            g.sort(key=_HELD, reverse=True)  # reverse keeps stability
        return _concat(groups)
