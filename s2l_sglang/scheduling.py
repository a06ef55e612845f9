"""Streaming-aware scheduling inside SGLang's scheduler (called from the plugin's hooks).

Per scheduling step, before SGLang builds a prefill batch:
1. snapshot: one `ReqView` per waiting request and per idle stream (a stream whose session holds
   KV and has no turn in flight);
2. plan: the pure `plan()` orders them by the selected policy and computes the KV shortfall of
   what it would run under the token budget and the free KV (free + LRU-evictable prefix cache);
3. acquire: where the plan does not fit, preempt the plan's victims (lowest priority first:
   idle streams, and waiting turns of streams that have not yet borrowed their KV), each by
   the mode the preemption policy picks for its own held tokens: recompute (release the
   session slot; private KV freed, its published prefix becomes ordinary LRU cache) or swap
   (copy to the host pool, `radix_ext.swap`, restored when its next turn waits). Either way
   its tokens, and so its output, are unchanged.
The waiting queue is also reordered by the policy (after SGLang's own `calc_priority`).

Settings come from `StreamConfig` (config.py), which reaches this process on SGLang's
`ServerArgs`; the policy can change at run time (`set_policy`).

This module reads and writes SGLang scheduler state (waiting queue, session slots, the tree
cache); the decisions themselves are the pure functions of `sched/`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from radix_ext.swap import HostKVPool
from s2l_sglang.config import StreamConfig
from s2l_sglang.rid import CANCELLED, is_final, is_speculative, is_volatile, stream_of
from s2l_sglang.sched.planner import choose_victims, plan
from s2l_sglang.sched.policy import get_policy
from s2l_sglang.sched.preemption import Preemption, get_preemption
from s2l_sglang.sched.snapshot import ReqView

logger = logging.getLogger(__name__)

_CLIP_MAX_NEW = 4096  # SGLang's CLIP_MAX_NEW_TOKENS default: the output budget it reserves


@dataclass
class StreamInfo:
    opened: float
    last_chunk: float
    complete: bool = False


@dataclass
class SchedCounters:
    preemptions_recompute: int = 0
    preemptions_swap: int = 0
    tokens_preempted: int = 0  # KV tokens released by recompute preemption
    tokens_swapped_out: int = 0  # KV tokens copied to the host pool
    tokens_swapped_in: int = 0  # KV tokens copied back from the host pool
    tokens_swap_reused: int = 0  # swapped tokens the radix tree still held at resume
    swap_in_dropped: int = 0  # resumes whose host copy did not fit back (recomputed)
    #: host copies never swapped back in (the stream recomputed, or closed): each is counted
    #: as a recompute preemption, not a swap one
    swap_copies_unused: int = 0
    #: scheduler-side hook calls that failed and fell back to SGLang's own behaviour
    hook_errors: int = 0
    plan_calls: int = 0
    #: most prompt tokens of speculative turns (prefill of contexts not yet final) admitted
    #: while one committed request (plain, or a final turn) waited in the queue: the bound of
    #: "a final context waits behind at most one speculative chunk" is this <= one chunk
    speculative_ahead_max: int = 0
    #: most prompt tokens of committed requests that entered the queue later, admitted while
    #: one committed request waited (0 under fcfs unless KV ran out: no starvation by order)
    newer_committed_ahead_max: int = 0
    committed_admitted: int = 0  # committed requests admitted (what the two maxima range over)
    plain_admitted: int = 0  # requests of no stream admitted (which ranks plain requests reach)
    #: most prompt tokens of volatile tails (rid.is_volatile) admitted while one other
    #: speculative turn waited: they go after it, so at most one chunk (SGLang's chunked one)
    volatile_ahead_max: int = 0
    turns_cancelled: int = 0  # stale speculative turns aborted while they waited

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class StreamScheduling:
    """Scheduler-side view of the streams (one per scheduler process)."""

    config: StreamConfig = field(default_factory=StreamConfig)
    streams: dict[str, StreamInfo] = field(default_factory=dict)
    counters: SchedCounters = field(default_factory=SchedCounters)

    #: rid -> [entered, speculative tokens ahead, newer committed tokens ahead] of committed
    #: requests seen waiting
    waited: dict[str, list[float]] = field(default_factory=dict)
    #: rid -> volatile-tail tokens admitted ahead, of speculative turns seen waiting
    spec_waited: dict[str, int] = field(default_factory=dict)

    preemption: Preemption | None = None
    host: HostKVPool | None = None
    profile_path: str | None = None
    _metrics: Any = None

    def __post_init__(self) -> None:
        self.set_policy(self.config.stream_policy)

    def set_policy(self, name: str) -> None:
        """Order by policy `name` from the next scheduling step on (a ValueError if unknown).
        The admission maxima (`speculative_ahead_max`, ...) start again: they describe the
        policy in force."""
        self.policy = get_policy(name)
        self.policy_name = name
        c = self.counters
        c.speculative_ahead_max = c.newer_committed_ahead_max = c.committed_admitted = 0
        c.volatile_ahead_max = 0
        self.waited.clear()
        self.spec_waited.clear()

    def configure(self, scheduler: Any) -> None:
        """Once per scheduler: the preemption mode, its cost model and the host KV pool."""
        if self.preemption is not None:
            return
        name = self.config.preemption
        cost_model = None
        if name == "auto":
            from s2l_sglang.sched.costmodel import find_cost_model, key_of_server_args

            dtype = str(scheduler.model_config.dtype).replace("torch.", "")
            key = key_of_server_args(scheduler.server_args, dtype)
            found = find_cost_model(key)
            if found is None:
                logger.warning(
                    "no preemption cost profile for %s (run `s2l profile`); preempting by "
                    "recompute",
                    key,
                )
                name = "recompute"
            else:
                cost_model, path = found
                self.profile_path = str(path)
                logger.info("preemption cost profile: %s", path)
        self.preemption = get_preemption(name, cost_model)
        if name != "recompute":
            capacity = self.config.host_kv_tokens or int(scheduler.max_total_num_tokens)
            self.host = HostKVPool(capacity)
        if getattr(scheduler, "enable_metrics", False):
            self._metrics = _prometheus_counters()

    # ---- events from the plugin's hooks -----------------------------------------------------

    def on_turn(self, rid: str) -> None:
        """A turn of a stream arrived at the scheduler (its last chunk's arrival)."""
        sid = stream_of(rid)
        now = time.perf_counter()  # SGLang's clock for queue-entry times
        info = self.streams.get(sid)
        if info is None:
            info = self.streams[sid] = StreamInfo(opened=now, last_chunk=now)
        info.last_chunk = now
        info.complete = is_final(rid)

    # ---- snapshot ---------------------------------------------------------------------------

    def _held(self, cache: Any, sid: str | None) -> tuple[int, int]:
        """(committed, allocated) KV tokens the stream's session slot holds."""
        slot = cache.session.slots.get(sid) if sid is not None else None
        if slot is None or not slot.kv.holds_kv:
            return 0, 0
        return slot.kv.kv_committed_len, slot.kv.kv_allocated_len

    def snapshot(self, scheduler: Any) -> list[ReqView]:
        cache = scheduler.tree_cache
        views: list[ReqView] = []
        now = time.perf_counter()
        self._prune(scheduler)
        for req in scheduler.waiting_queue:
            sid = stream_of(req.rid)
            info = self.streams.get(sid) if sid is not None else None
            held, allocated = self._held(cache, sid)
            slot = cache.session.slots.get(sid) if sid is not None else None
            # A waiting turn that has not borrowed its slot yet can be preempted like an idle
            # stream (its next admission re-matches from the tree); one that has, cannot.
            preemptible = slot is not None and allocated > 0 and req.kv is not slot.kv
            # A plain request keeps the time it entered SGLang's queue (never re-stamped, so
            # it cannot be overtaken for ever by later work of its own class).
            arrival = info.opened if info is not None else _entered(req, now)
            views.append(
                ReqView(
                    rid=req.rid,
                    is_stream=info is not None,
                    complete=info.complete if info is not None else True,
                    arrival=arrival,
                    last_chunk=info.last_chunk if info is not None else arrival,
                    held=held,
                    # KV its admission needs: SGLang admits a request only if its whole
                    # extend plus its (clipped) output budget fits.
                    pending=max(1, len(req.origin_input_ids) - held)
                    + min(req.sampling_params.max_new_tokens or 0, _CLIP_MAX_NEW),
                    state="waiting",
                    decoding=False,
                    reclaimable_kv=allocated if preemptible else 0,
                )
            )
        for sid, slot in cache.session.slots.items():
            info = self.streams.get(sid)
            session = scheduler.session_controller.get(sid)
            if info is None or session is None or session._inflight or not slot.kv.holds_kv:
                continue
            views.append(
                ReqView(
                    rid=sid,
                    is_stream=True,
                    complete=info.complete,
                    arrival=info.opened,
                    last_chunk=info.last_chunk,
                    held=slot.kv.kv_committed_len,
                    pending=0,
                    state="idle",
                    decoding=False,
                    reclaimable_kv=slot.kv.kv_allocated_len,
                )
            )
        return views

    # ---- ordering and acquisition -----------------------------------------------------------

    def _prune(self, scheduler: Any) -> None:
        """Forget streams whose session has closed (the table would otherwise only grow)."""
        sessions = scheduler.session_controller.sessions
        if len(self.streams) > 2 * len(sessions) + 64:
            self.streams = {sid: i for sid, i in self.streams.items() if sid in sessions}

    def order_waiting(self, scheduler: Any) -> None:
        """Reorder SGLang's waiting queue by the policy. Under every policy committed work
        (plain requests, final turns) goes before speculative work (prefill turns of contexts
        not yet final), and volatile tails (rid.is_volatile) after everything, so SGLang admits
        speculative turns only with the budget left over; `default` keeps SGLang's order
        within each class."""
        if len(scheduler.waiting_queue) < 2:
            return
        if self.policy_name == "default" and not any(
            is_speculative(req.rid) for req in scheduler.waiting_queue
        ):
            return
        by_rid = {req.rid: req for req in scheduler.waiting_queue}
        views = [v for v in self.snapshot(scheduler) if v.state == "waiting"]
        order = [v.rid for v in self.policy.order(views)]
        # volatile tails (update mode: what the last refinement rewrote) go last: they get
        # only the budget that every other request leaves
        order = [r for r in order if not is_volatile(r)] + [r for r in order if is_volatile(r)]
        scheduler.waiting_queue[:] = [by_rid[rid] for rid in order if rid in by_rid]

    def relieve_kv_pressure(self, scheduler: Any) -> list[str]:
        """Swap waiting streams back in; then preempt idle streams the plan did not pick until
        the planned prefill fits."""
        self.configure(scheduler)
        self._forget_host_copies(scheduler)
        if not (scheduler.waiting_queue or scheduler.chunked_req):
            return []
        views = self.snapshot(scheduler)
        # The next admission SGLang will try: the policy's first waiting request. Ordered at
        # most once per step, and only where needed (swap-in, or KV held by preemptible streams).
        first: ReqView | None | bool = False
        if self.host is not None and self.host.entries:
            first = self._first_waiting(views)
            self._swap_in_waiting(scheduler, first.rid if first is not None else None)
        if not scheduler.tree_cache.session.slots:
            return []
        if not any(v.reclaimable_kv for v in views):
            return []
        free_kv = (
            scheduler.token_to_kv_pool_allocator.available_size()
            + scheduler.tree_cache.evictable_size()
        )
        chunked = scheduler.chunked_req
        if chunked is not None:  # mid-prefill: its next chunk comes first
            chunk = scheduler.chunked_prefill_size or 0
            left = len(chunked.full_untruncated_fill_ids) - (
                chunked.kv.kv_allocated_len if chunked.kv.holds_kv else 0
            )
            free_kv -= max(0, min(left, chunk))
        if first is False:
            first = self._first_waiting(views)
        if first is None:
            return []
        self.counters.plan_calls += 1
        step = plan(views, self.policy, token_budget=first.pending, free_kv=max(0, free_kv))
        if step.kv_shortfall <= 0:
            return []
        victims = choose_victims(step, views, step.kv_shortfall)
        by_rid = {v.rid: v for v in views}
        released = []
        for rid in victims:
            view = by_rid[rid]
            sid = rid if view.state == "idle" else stream_of(rid)
            if not view.reclaimable_kv or sid not in scheduler.tree_cache.session.slots:
                continue
            mode = self._preempt(scheduler, sid, view.reclaimable_kv)
            released.append(f"{sid} ({mode})")
        if released:
            logger.info(
                "KV pressure (short %d tokens): preempted streams %s",
                step.kv_shortfall,
                ", ".join(released),
            )
        return released

    def cancel_waiting_turn(self, scheduler: Any, rid: str) -> bool:
        """Abort stream turn `rid` (with the message `CANCELLED`) if it waits in the queue
        and has not borrowed its session's KV slot; True if it was aborted. A turn that runs,
        or waits holding the slot, is left alone: SGLang drops the slot of an aborted turn
        that holds it, and the stream would recompute its whole context."""
        from sglang.srt.managers.io_struct import AbortReq

        req = next((r for r in scheduler.waiting_queue if r.rid == rid), None)
        if req is None or not is_speculative(rid):
            return False
        sid = stream_of(rid)
        slot = scheduler.tree_cache.session.slots.get(sid)
        if slot is not None and req.kv is slot.kv:
            return False
        reason = {"type": "abort", "message": CANCELLED}
        scheduler.abort_request(AbortReq(rid=rid, finished_reason=reason))
        self.counters.turns_cancelled += 1
        return True

    # ---- admission accounting (the speculative-work bound) ------------------------------------

    def before_admission(self, scheduler: Any) -> list[Any]:
        """The committed requests waiting as SGLang builds a prefill batch."""
        now = time.perf_counter()
        waiting = []
        for req in scheduler.waiting_queue:
            if is_speculative(req.rid):
                if not is_volatile(req.rid):
                    self.spec_waited.setdefault(req.rid, 0)
                    waiting.append(req)
                continue
            if req.rid not in self.waited:
                self.waited[req.rid] = [_entered(req, now), 0, 0]
            waiting.append(req)
        return waiting

    def after_admission(self, batch: Any, waiting: list[Any]) -> None:
        """Charge what `batch` admitted to each committed request that still waits; close the
        account of those it admitted."""
        batch = getattr(batch, "batch_to_run", batch)  # SGLang returns a NextBatchPlan
        admitted = list(batch.reqs) if batch is not None else []
        self.counters.plain_admitted += sum(1 for r in admitted if stream_of(r.rid) is None)
        ids = {id(r) for r in admitted}
        spec = sum(r.extend_len for r in admitted if is_speculative(r.rid))
        volatile = sum(r.extend_len for r in admitted if is_volatile(r.rid))
        committed = [
            (self.waited.get(r.rid, [0.0])[0], r.extend_len)
            for r in admitted
            if not is_speculative(r.rid)
        ]
        for req in waiting:
            if req.rid in self.spec_waited:  # a speculative turn: volatile work ahead of it
                if id(req) in ids:
                    ahead = self.spec_waited.pop(req.rid)
                    c = self.counters
                    c.volatile_ahead_max = max(c.volatile_ahead_max, ahead)
                else:
                    self.spec_waited[req.rid] += volatile
                continue
            account = self.waited.get(req.rid)
            if account is None:
                continue
            if id(req) in ids:
                c = self.counters
                c.committed_admitted += 1
                c.speculative_ahead_max = max(c.speculative_ahead_max, int(account[1]))
                c.newer_committed_ahead_max = max(c.newer_committed_ahead_max, int(account[2]))
                del self.waited[req.rid]
                continue
            account[1] += spec
            account[2] += sum(n for entered, n in committed if entered > account[0])
        if len(self.waited) + len(self.spec_waited) > 4 * len(waiting) + 256:  # aborted
            keep = {r.rid for r in waiting}
            self.waited = {rid: a for rid, a in self.waited.items() if rid in keep}
            self.spec_waited = {rid: a for rid, a in self.spec_waited.items() if rid in keep}

    def _first_waiting(self, views: list[ReqView]) -> ReqView | None:
        return next((v for v in self.policy.order(views) if v.state == "waiting"), None)

    def _preempt(self, scheduler: Any, sid: str, held: int) -> str:
        """Preempt stream `sid` holding `held` KV tokens: swap or recompute, per victim."""
        assert self.preemption is not None
        cache = scheduler.tree_cache
        host_free = self.host.free_tokens if self.host is not None else 0
        if self.host is not None and self.preemption.decide(held, host_free) == "swap":
            swapped = self.host.swap_out(cache, sid, _committed_tokens(scheduler, sid))
            if swapped:
                self.counters.preemptions_swap += 1
                self.counters.tokens_swapped_out += swapped
                self._count_metric("swap", swapped)
                return "swap"
        cache.release_session(sid)
        self.counters.preemptions_recompute += 1
        self.counters.tokens_preempted += held
        self._count_metric("recompute", held)
        return "recompute"

    def _swap_in_waiting(self, scheduler: Any, head_rid: str | None) -> None:
        """Restore the host KV of streams whose next turn waits: the policy's next admission
        (evicting LRU cache if needed), others only into free KV (no thrashing of victims).
        """
        assert self.host is not None
        allocator = scheduler.token_to_kv_pool_allocator
        for req in list(scheduler.waiting_queue):
            sid = stream_of(req.rid)
            if sid is None or sid not in self.host:
                continue
            if req.rid != head_rid and allocator.available_size() < self.host.entries[sid].size:
                continue
            result = self.host.swap_in(scheduler.tree_cache, sid)
            self.counters.tokens_swapped_in += result.restored
            self.counters.tokens_swap_reused += result.reused
            self.counters.swap_in_dropped += int(result.dropped)

    def _forget_host_copies(self, scheduler: Any) -> None:
        """Drop the host copies nobody will swap in: of streams that closed, and of streams
        that hold a session slot again (their turn was admitted without the copy, and
        recomputed). Runs every scheduler step, so a closed stream's copy goes at once. Such
        a preemption was in effect a recompute one, and is counted so."""
        if self.host is None or not self.host.entries:
            return
        slots = scheduler.tree_cache.session.slots
        for sid in list(self.host.entries):
            slot = slots.get(sid)
            regained = slot is not None and slot.kv.holds_kv
            if regained or scheduler.session_controller.get(sid) is None:
                size = self.host.drop(sid)
                self.counters.swap_copies_unused += 1
                self.counters.preemptions_swap -= 1
                self.counters.preemptions_recompute += 1
                self.counters.tokens_swapped_out -= size
                self.counters.tokens_preempted += size

    def _count_metric(self, mode: str, tokens: int) -> None:
        if self._metrics is not None:
            preemptions, preempted_tokens = self._metrics
            preemptions.labels(mode=mode, policy=self.policy_name).inc()
            preempted_tokens.labels(mode=mode, policy=self.policy_name).inc(tokens)

    def export(self, scheduler: Any = None) -> dict[str, Any]:
        """The counters, policy and preemption set-up (SGLang's `get_internal_state`), and,
        given the scheduler, what streams hold right now: open sessions, session slots (each
        pins KV), host copies. All three are 0 when no stream is live."""
        state: dict[str, Any] = {
            **self.counters.as_dict(),
            "policy": self.policy_name,
            "preemption": self.preemption.name if self.preemption is not None else None,
            "profile": self.profile_path,
            "host_kv_used": self.host.used_tokens if self.host is not None else 0,
            "host_copies": len(self.host.entries) if self.host is not None else 0,
        }
        if scheduler is not None:
            from sglang.srt.runtime_context import get_parallel

            slots = getattr(getattr(scheduler.tree_cache, "session", None), "slots", {})
            state["open_sessions"] = len(scheduler.session_controller.sessions)
            state["session_slots"] = len(slots)
            # data parallel: this scheduler's rank, and the streams whose turns reached it
            # (stream ids: a session key is the stream id, a dot, 16 random hex digits)
            state["dp_rank"] = get_parallel().dp_rank or 0
            seen = [key.rpartition(".")[0] for key in list(self.streams)[-SEEN_STREAMS:]]
            state["turn_streams"] = seen
        return state


#: most stream ids `export` lists in `turn_streams` (the latest)
SEEN_STREAMS = 256


def _entered(req: Any, now: float) -> float:
    """When `req` entered SGLang's waiting queue (SGLang's perf_counter clock); `now` if unset."""
    return getattr(getattr(req, "time_stats", None), "wait_queue_entry_time", 0.0) or now


def _committed_tokens(scheduler: Any, sid: str) -> list[int]:
    """The token ids whose KV stream `sid`'s session holds (its last finished turn's)."""
    session = scheduler.session_controller.get(sid)
    if session is None or not session.req_nodes or session.committed_origin_len is None:
        return []
    [node] = session.req_nodes.values()
    return list(node.req.origin_input_ids[: session.committed_origin_len])


def _prometheus_counters() -> tuple[Any, Any]:
    """Counters in SGLang's Prometheus registry (multiprocess: the HTTP server exports them)."""
    from prometheus_client import Counter

    return (
        Counter(
            "sglang:s2l_preemptions_total",
            "Streams preempted under KV pressure, by mode and policy",
            ["mode", "policy"],
        ),
        Counter(
            "sglang:s2l_preempted_tokens_total",
            "KV tokens preempted (recompute: released; swap: copied to host)",
            ["mode", "policy"],
        ),
    )
