"""Streaming-aware scheduling inside SGLang's scheduler (called from the plugin's hooks).

Per scheduling step, before SGLang builds a prefill batch, `relieve_kv_pressure` takes a
snapshot of SGLang's state (`adapter.snapshot`), asks the pure `sched.decide.decide` what to do
(drop unused host copies, swap waiting streams back in, preempt idle streams where the plan
of the policy's next admission does not fit the free KV: recompute or swap per victim), and has
the adapter apply it (`adapter.apply`); then it counts what was done. At SGLang's
`calc_priority` the waiting queue is reordered by `sched.decide.decide_order`.

Settings come from `StreamConfig` (config.py), which reaches this process on SGLang's
`ServerArgs`; the policy can change at run time (`set_policy`).

This module holds the scheduler-side state (the stream table, counters, the host KV pool) and
touches SGLang only through `s2l_sglang/adapter.py`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from radix_ext.swap import HostKVPool
from s2l_sglang import adapter
from s2l_sglang.config import StreamConfig, default_host_kv_tokens
from s2l_sglang.rid import CANCELLED, REBASE, is_final, is_speculative, is_volatile, stream_of
from s2l_sglang.sched.decide import (
    RecentMax,
    Snapshot,
    StreamInfo,
    cap_step,
    committed_need,
    decide,
    decide_order,
    hold,
    in_force,
    is_speculative_work,
    lifted,
    may_cancel,
    needs_order,
    promote,
    record_turn,
    waiting_views,
)
from s2l_sglang.sched.policy import get_policy
from s2l_sglang.sched.preemption import Preemption, get_preemption

logger = logging.getLogger(__name__)


@dataclass
class SchedCounters:
    preemptions_recompute: int = 0
    preemptions_swap: int = 0
    tokens_preempted: int = 0  # KV tokens released by recompute preemption
    tokens_swapped_out: int = 0  # KV tokens copied to the host pool
    tokens_swapped_in: int = 0  # KV tokens copied back from the host pool
    tokens_swap_reused: int = 0  # swapped tokens the radix tree still held at resume
    #: tokens of copies already swapped in that LRU eviction took from the tree before their
    #: turn was admitted, copied back again from the host copy (kept until then)
    tokens_swapped_in_again: int = 0
    swap_in_dropped: int = 0  # resumes whose host copy did not fit back (recomputed)
    #: host copies never swapped back in (the stream recomputed, or closed): each is counted
    #: as a recompute preemption, not a swap one
    swap_copies_unused: int = 0
    #: closed streams whose KV was handed to the radix tree rather than freed
    #: (`radix_ext.publish`): a later request with the same context hits the cache
    streams_published: int = 0
    tokens_published: int = 0  # their tokens now in the tree past what they had published
    #: of those, tokens whose KV the tree adopted from the stream (the rest it already held)
    tokens_published_adopted: int = 0
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
    #: speculative turns of a finishing stream that could not be cancelled (they waited on
    #: their session's KV), ranked as committed work from then on (`sched.decide.promote`)
    turns_promoted: int = 0
    #: streams preempted because SGLang admitted nothing for `STALL_STEPS` steps while nothing
    #: ran though the plan counted room for the head (a KV count that differs from SGLang's)
    stall_preemptions: int = 0
    stalled_steps_max: int = 0  # most steps in a row that admitted nothing while nothing ran
    #: speculative turns kept out of an admission at least once, so that speculative KV
    #: leaves `spec_reserve` free for committed work (`sched.decide.hold`)
    turns_held_for_kv: int = 0
    #: admissions in which speculative turns were kept out so that one step prefills at most
    #: `speculative_chunk` speculative tokens (`sched.decide.cap_step`)
    admissions_capped: int = 0
    #: most prompt tokens of speculative turns prefilled in one step (a mid-prefill one's
    #: chunk included; a turn of a stream whose context has become final is committed work
    #: here, as `cap_step` counts it): at most `speculative_chunk` but for a stall (`lifted`)
    speculative_step_max: int = 0
    #: stalls that lasted `SPEC_STALL_S` (`sched.decide.lifted`): speculative work was then
    #: planned as committed work (no reserve, victims recomputed where not swapped)
    stall_lifts: int = 0
    #: KV tokens released by recompute for speculative work (only ever after such a stall)
    tokens_preempted_for_speculative: int = 0
    #: final turns sent without waiting for their stream's prefill turn in flight (built on
    #: it): most arrive once it has ended (SGLang ingests between steps) and go on at once
    finals_pipelined: int = 0
    #: of those: arrived while that turn was still in flight (queued, or chunked), kept here and
    #: handed to SGLang in the first scheduling step after that turn ended (`park_final`)
    finals_parked: int = 0
    #: final turns sent back to the manager (abort `REBASE`): the turn they were built on
    #: did not finish (it was cancelled)
    finals_rebased: int = 0
    #: pipelined final turns whose turn before still waited in the queue (not on its slot):
    #: that turn was cancelled and the final turn carries what it keeps of its tokens
    #: (`merge_into_final`), rather than waiting for it to be admitted and prefilled
    finals_merged: int = 0
    #: orders of SGLang's waiting queue made (`sched.decide.decide_order`: two or more
    #: requests waiting; under `default`, a speculative turn among them)
    queue_orders: int = 0
    #: of those: made while the policy in force was the one the policy names for a KV
    #: pool that holds all the waiting work (`Policy.roomy`, `sched.decide.in_force`: mcps
    #: orders as lcas then); 0 under a policy that names none
    orders_roomy: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


#: the counters that are maxima, not counts (`set_policy` starts them again)
MAXIMA = tuple(f for f in SchedCounters.__dataclass_fields__ if f.endswith("_max"))


@dataclass
class Parked:
    """A final turn kept out of SGLang until its stream's turn in flight has ended."""

    req: Any  # SGLang's TokenizedGenerateReqInput
    after: str  # the rid of the turn it was built on
    aborted: str | None = None  # an abort that came meanwhile: its message


#: `park_final`'s verdicts besides an abort message
PASS, PARK = "pass", "park"


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
    #: speculative turns promoted to committed work (their stream is finishing)
    promoted: set[str] = field(default_factory=set)

    preemption: Preemption | None = None
    host: HostKVPool | None = None
    #: prefill steps in a row that admitted nothing while requests were offered to the
    #: admission (not only held turns) and nothing ran
    stalled: int = 0
    #: when the engine stalled (nothing admitted, nothing running, requests waiting, held
    #: ones too; SGLang's clock); 0.0: not stalled
    stalled_since: float = 0.0
    lift_counted: bool = False  # this stall was counted in `stall_lifts`
    all_held: bool = False  # this admission's every waiting request was held out
    #: KV committed requests asked (prompt and output budget) while they waited, the largest
    #: of the last `RESERVE_WINDOW_S` seconds kept: the automatic reserve
    committed_needs: RecentMax = field(default_factory=RecentMax)
    #: inside SGLang's `get_new_batch_prefill` (only there are turns held out of the queue)
    in_prefill: bool = False
    held: list[Any] = field(default_factory=list)  # SGLang's requests held out of the queue
    held_rids: set[str] = field(default_factory=set)  # turns held at least once (counted)
    profile_path: str | None = None
    #: what `adapter.check_contract` found missing in this SGLang (checked once, at configure)
    contract: list[str] | None = None
    _metrics: Any = None
    #: session key -> a final turn waiting for the stream's turn in flight (`park_final`)
    parked: dict[str, Parked] = field(default_factory=dict)
    #: final turns recorded as their stream's latest turn when `park_final` kept them: SGLang
    #: creating them later does not record them again (`on_turn`)
    recorded_kept: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.set_policy(self.config.stream_policy)

    def set_policy(self, name: str) -> None:
        """Order by policy `name` from the next scheduling step on (a ValueError if unknown).
        Every maximum (`speculative_ahead_max`, `stalled_steps_max`, ...) and
        `committed_admitted` start again: they describe the policy in force (the benchmark
        sets the policy before each replay, so they are that replay's)."""
        self.policy = get_policy(name)
        self.policy_name = name
        c = self.counters
        for key in MAXIMA:
            setattr(c, key, 0)
        c.committed_admitted = 0
        self.waited.clear()
        self.spec_waited.clear()

    def set_publish_at_close(self, on: bool) -> None:
        """Publish closing streams' KV (`StreamConfig.publish_at_close`) from the next close
        on; the rest of the configuration stays as it is."""
        self.config = replace(self.config, publish_at_close=on)

    def configure(self, scheduler: Any) -> None:
        """Once per scheduler: the preemption mode, its cost model and the host KV pool."""
        if self.preemption is not None:
            return
        self.contract = adapter.check_contract(scheduler)
        if self.contract:
            logger.error("SGLang lacks what the stream scheduler reads: %s", self.contract)
        name = self.config.preemption
        cost_model = None
        if name == "auto":
            from s2l_sglang.sched.costmodel import find_cost_model, key_of_server_args

            key = key_of_server_args(adapter.server_args(scheduler), adapter.model_dtype(scheduler))
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
            self.host = HostKVPool(self._host_capacity(scheduler))
        if adapter.metrics_enabled(scheduler):
            self._metrics = _prometheus_counters()

    def _host_capacity(self, scheduler: Any) -> int:
        """The host pool's size in tokens: `host_kv_tokens`, else `HOST_KV_BYTES` of the model's
        KV (the device pool's size where this SGLang does not say its bytes per token)."""
        if self.config.host_kv_tokens:
            return self.config.host_kv_tokens
        try:
            per_token = adapter.kv_bytes_per_token(scheduler)
        except Exception:  # noqa: BLE001 - named by check_contract; the old default then
            logger.exception("KV bytes per token unknown; host pool = the device pool's size")
            return adapter.max_total_tokens(scheduler)
        capacity = default_host_kv_tokens(per_token)
        logger.info(
            "host KV pool: %d tokens (%.1f GiB at %d bytes a token; --host-kv-tokens sets it)",
            capacity,
            capacity * per_token / (1 << 30),
            per_token,
        )
        return capacity

    # ---- events from the plugin's hooks -----------------------------------------------------

    def on_turn(self, rid: str) -> None:
        """A turn of a stream arrived at the scheduler (its last chunk's arrival). A final
        turn kept by `park_final` arrived when it was kept (`record_kept`): SGLang creating it
        at its release is not a new arrival (under `lcas` its rank would be the release time,
        behind committed work that came while it was kept)."""
        if rid in self.recorded_kept:
            self.recorded_kept.discard(rid)
            return
        sid = stream_of(rid)
        if sid is not None:
            self.streams[sid] = record_turn(self.streams, rid, adapter.now())
            if self.promoted:
                self.promoted = {r for r in self.promoted if stream_of(r) != sid}

    # ---- ordering and acquisition -----------------------------------------------------------

    def _prune(self, scheduler: Any) -> None:
        """Forget streams whose session has closed (the table would otherwise only grow)."""
        if len(self.streams) > 64:
            sessions = adapter.open_sessions(scheduler)
            if len(self.streams) > 2 * len(sessions) + 64:
                self.streams = {sid: i for sid, i in self.streams.items() if sid in sessions}

    def spec_reserve(self, scheduler: Any, now: float) -> int:
        """KV that speculative work leaves free for committed work: `speculative_reserve`,
        else the largest committed request seen waiting in the last `RESERVE_WINDOW_S`
        seconds (at least one speculative chunk), at most half the pool."""
        if self.config.speculative_reserve is not None:
            return self.config.speculative_reserve
        seen = max(self.committed_needs.value(now), self.config.speculative_chunk)
        return min(seen, adapter.max_total_tokens(scheduler) // 2)

    def _snapshot(self, scheduler: Any, running_batch: Any = None) -> Snapshot:
        """`adapter.snapshot` with what this side knows: the stall and the reserve."""
        snap = adapter.snapshot(scheduler, self.host, running_batch, self.stalled)
        stalled_s = snap.now - self.stalled_since if self.stalled_since else 0.0
        return snap._replace(
            stalled_s=stalled_s, spec_reserve=self.spec_reserve(scheduler, snap.now)
        )

    def order_waiting(self, scheduler: Any) -> None:
        """Reorder SGLang's waiting queue by the policy (`sched.decide.decide_order`); inside
        an admission, take the speculative turns that would eat into the reserve out of the
        queue until it ends (`sched.decide.hold`, `put_back`)."""
        keep = self.policy_name == "default"
        rids = adapter.waiting_rids(scheduler)
        holding = self.in_prefill and any(map(is_speculative, rids))
        if not holding and not needs_order(rids, keep):  # before any snapshot
            return
        snap = self._snapshot(scheduler)
        views_ = waiting_views(snap, self.streams)  # shared by the order, hold and cap_step
        # the policy in force, once for the order and the counter (`decide_order`'s own
        # `in_force` is then free with room; under pressure it stops at the first request
        # past the free KV)
        policy = in_force(self.policy, snap)
        order = decide_order(snap, self.streams, policy, keep, views_)
        if order is not None:
            adapter.reorder(scheduler, order)
            self.counters.queue_orders += 1
            self.counters.orders_roomy += policy is not self.policy
        if holding:
            held = hold(snap, self.streams, order, views_)
            if held:
                taken = adapter.hold_out(scheduler, held)
                self.held.extend(taken)
                self.all_held = len(taken) == len(rids)
                new = set(held) - self.held_rids
                self.counters.turns_held_for_kv += len(new)
                self.held_rids |= new
            if lifted(snap):
                return
            limit = self.config.speculative_chunk
            capped = cap_step(snap, self.streams, limit, order, set(held), views_)
            if capped:
                taken = adapter.hold_out(scheduler, capped)
                self.held.extend(taken)
                self.all_held = len(self.held) == len(rids)
                self.counters.admissions_capped += 1

    def begin_admission(self) -> None:
        """SGLang starts an admission (`get_new_batch_prefill`): turns may be held out."""
        self.in_prefill, self.all_held = True, False

    def end_admission(self, scheduler: Any) -> None:
        """The admission is over: the turns `order_waiting` held out go back to the queue."""
        self.in_prefill = False
        if self.held:
            held, self.held = self.held, []
            adapter.put_back(scheduler, held)
        if len(self.held_rids) > 512:
            self.held_rids &= set(adapter.waiting_rids(scheduler))

    def relieve_kv_pressure(self, scheduler: Any, running_batch: Any = None) -> list[str]:
        """One step's drops, swap-ins and preemptions (`sched.decide.decide`), applied by the
        adapter and counted; returns the preempted streams, each with its mode.
        `running_batch`: the batch SGLang is about to admit beside (its KV reserve counts)."""
        self.configure(scheduler)
        if not adapter.has_work_waiting(scheduler) and not (self.host and self.host.entries):
            return []
        self._prune(scheduler)
        snap = self._snapshot(scheduler, running_batch)
        self.committed_needs.observe(snap.now, committed_need(snap, self.streams))
        if lifted(snap) and not self.lift_counted:
            self.counters.stall_lifts += 1
            self.lift_counted = True
        actions = decide(snap, self.streams, self.policy, self.preemption)
        self.counters.plan_calls += int(actions.planned)
        done = adapter.apply(scheduler, actions, self.host)
        c = self.counters
        if actions.forced:
            c.stall_preemptions += len(done.preempted)
            logger.warning(
                "no request admitted for %d steps while nothing ran: preempting %s",
                self.stalled,
                [sid for sid, _, _ in done.preempted],
            )
        for entry in done.dropped:
            if entry.restored:  # swapped in, and its stream holds a slot again (or closed)
                continue
            c.swap_copies_unused += 1  # never swapped in: in effect a recompute
            c.preemptions_swap -= 1
            c.preemptions_recompute += 1
            c.tokens_swapped_out -= entry.size
            c.tokens_preempted += entry.size
        for result in done.swapped_in:
            if result.again:  # LRU eviction took this much of a copy back in the tree
                c.tokens_swapped_in_again += result.restored
            else:
                c.tokens_swapped_in += result.restored
                c.tokens_swap_reused += result.reused
            c.swap_in_dropped += int(result.dropped)
        released = []
        for sid, mode, tokens in done.preempted:
            if mode == "swap":
                c.preemptions_swap += 1
                c.tokens_swapped_out += tokens
            else:
                c.preemptions_recompute += 1
                c.tokens_preempted += tokens
                if actions.for_speculative:
                    c.tokens_preempted_for_speculative += tokens
            self._count_metric(mode, tokens)
            released.append(f"{sid} ({mode})")
        if released:
            logger.info(
                "KV pressure (short %d tokens): preempted streams %s",
                actions.shortfall,
                ", ".join(released),
            )
        return released

    def after_prefill_step(self, scheduler: Any, batch: Any, running_batch: Any) -> None:
        """Count the step toward a stall (`adapter.stalled_step`) or end it: its start time
        (any stall: `sched.decide.lifted`) and its steps (one in which only held turns
        waited is not counted: the forced preemption of `STALL_STEPS` mistrusts a KV count
        that let a request it admits wait)."""
        if adapter.stalled_step(scheduler, batch, running_batch):
            if not self.stalled_since:
                self.stalled_since = adapter.now()
            if not self.all_held:  # held turns were not offered: no count to mistrust
                self.stalled += 1
                c = self.counters
                c.stalled_steps_max = max(c.stalled_steps_max, self.stalled)
        else:
            self.stalled, self.stalled_since = 0, 0.0
            self.lift_counted = False

    def cancel_waiting_turn(self, scheduler: Any, rid: str, finishing: bool = False) -> bool:
        """Abort stream turn `rid` (with the message `CANCELLED`) if it waits in the queue
        and has not borrowed its session's KV slot (`sched.decide.may_cancel`); True if it
        was aborted. Otherwise, if its stream is `finishing` and the turn still waits (on its
        slot), promote it: the stream's context is taken as final, so the turn ranks as
        committed work and the final turn, which waits for it, is not held behind
        speculative work (`sched.decide.promote`)."""
        snap = adapter.snapshot(scheduler)
        if may_cancel(snap, rid):
            adapter.abort_waiting(scheduler, rid, CANCELLED)
            self.counters.turns_cancelled += 1
            return True
        if finishing and is_speculative(rid) and any(w.rid == rid for w in snap.waiting):
            self._promote(rid, adapter.now())
        return False

    def _promote(self, rid: str, at: float) -> None:
        """Speculative turn `rid` ranks as committed work from `at` on: its stream is finishing
        and the final turn waits for it (`sched.decide.promote`)."""
        self.streams[stream_of(rid)] = promote(self.streams, rid, at)
        self.promoted.add(rid)
        self.counters.turns_promoted += 1

    # ---- the pipelined finish: a final turn sent while the turn before runs ----------------

    def park_final(self, scheduler: Any, recv_req: Any) -> str:
        """A turn reaching `Scheduler.handle_generate_request`. A final turn that names the turn
        it was built on (`session_params.rid`, set by the manager when it sends the final turn
        without waiting for the turn in flight) is
        - merged with that turn (PASS) if that turn still waits in the queue without its
          session's slot (`merge_into_final`): it is cancelled, and the final turn carries
          what it keeps of its tokens;
        - kept here (PARK) while its session has a turn in flight: SGLang would abort it
          ("already has an active request"). The stream's context is final from now on, so a
          speculative turn of it still waiting ranks as committed work (`promote`);
        - handed to SGLang (PASS) if the session's last finished turn is that turn;
        - otherwise aborted with `REBASE` (returned: the caller aborts it once SGLang queued
          it; its rollback is dropped first): the manager sends it again, built on what the
          session holds.
        Every other request: PASS."""
        if not is_final(recv_req.rid):
            return PASS
        after = adapter.take_after(recv_req)
        if after is None:
            return PASS
        key = stream_of(recv_req.rid)
        session = adapter.session(scheduler, key)
        if session is None:
            return PASS  # SGLang aborts it: no such session
        self.counters.finals_pipelined += 1
        if adapter.turn_in_flight(session):
            if self.merge_into_final(scheduler, recv_req, after):
                return PASS
            self.parked[key] = Parked(recv_req, after)
            self.counters.finals_parked += 1
            self.record_kept(recv_req.rid)
            at = adapter.now()
            for rid in adapter.waiting_rids(scheduler):
                if stream_of(rid) == key and is_speculative(rid):
                    self._promote(rid, at)
            return PARK
        return self._built_on(session, recv_req, after)

    def merge_into_final(self, scheduler: Any, recv_req: Any, after: str) -> bool:
        """Final turn `recv_req` was built on turn `after`, which may still wait in the queue:
        the volatile tail of an update (ranked after all other work, held for KV) can wait
        there for many seconds, and the final turn kept behind it waited until it was
        admitted and prefilled, stale tokens and all (memory-pressure-tails, 2026-12-06: 21
        of 24 parked finals, 0.6 s on average, up to 2.6 s). If `after` waits without its
        session's slot, it is cancelled (`CANCELLED`: the manager counts its tokens as
        promoted) and the final turn carries the tokens of it that it keeps, so it goes to
        SGLang at once as committed work (`adapter.merge_queued_turn`). True if merged."""
        if not adapter.merge_queued_turn(scheduler, recv_req, after, CANCELLED):
            return False
        self.counters.finals_merged += 1
        return True

    def record_kept(self, rid: str) -> None:
        """Final turn `rid`, kept while its session's turn runs, arrived now: its stream's
        context is final from now on (`on_turn` leaves this record when SGLang creates it)."""
        self.on_turn(rid)
        self.recorded_kept.add(rid)

    def handed_over(self, rid: str) -> None:
        """Kept final turn `rid` was handed to SGLang (`release_parked`): if SGLang did not
        create it (it rejected the request before its session took it), `on_turn` never came
        and its record is dropped here, so `recorded_kept` holds only turns still kept."""
        self.recorded_kept.discard(rid)

    def _built_on(self, session: Any, recv_req: Any, after: str) -> str:
        """PASS if the session's last finished turn is `after`; otherwise REBASE, the turn's
        rollback dropped (it is aborted before it runs)."""
        if session is None or adapter.last_turn_rid(session) == after:
            return PASS
        adapter.plain_append(recv_req)
        self.counters.finals_rebased += 1
        return REBASE

    def release_parked(self, scheduler: Any) -> list[tuple[Any, str]]:
        """The parked final turns whose session has no turn in flight any more (or is gone),
        taken out, each with its verdict: PASS (hand it to SGLang), or an abort message to
        abort it with once SGLang has queued it (`REBASE`, or an abort that came meanwhile)."""
        out = []
        for key, parked in list(self.parked.items()):
            session = adapter.session(scheduler, key)
            if session is not None and adapter.turn_in_flight(session):
                continue
            del self.parked[key]
            if session is None:  # SGLang aborts it without creating it
                self.recorded_kept.discard(parked.req.rid)
            if parked.aborted is not None:
                adapter.plain_append(parked.req)
                out.append((parked.req, parked.aborted))
            else:
                out.append((parked.req, self._built_on(session, parked.req, parked.after)))
        return out

    def abort_parked(self, abort_req: Any) -> None:
        """`Scheduler.abort_request(abort_req)` is called: parked turns it names are marked, and
        aborted once handed to SGLang (they cannot be before: their session is busy)."""
        for parked in self.parked.values():
            if adapter.abort_matches(abort_req, parked.req.rid):
                parked.aborted = adapter.abort_message(abort_req)

    def _speculative(self, rid: str) -> bool:
        """Speculative work for the admission accounting: a prefill turn not promoted."""
        return is_speculative(rid) and rid not in self.promoted

    # ---- admission accounting (the speculative-work bound) ------------------------------------

    def before_admission(self, scheduler: Any) -> dict[str, int]:
        """The requests whose account is kept (committed ones, and speculative turns that are
        not volatile) waiting as SGLang builds a prefill batch: rid -> identity."""
        at = adapter.now()
        ids = adapter.waiting_ids(scheduler)
        waiting = {}
        for rid, entered in adapter.waiting_entries(scheduler, at):
            if self._speculative(rid):
                if not is_volatile(rid):
                    self.spec_waited.setdefault(rid, 0)
                    waiting[rid] = ids[rid]
                continue
            if rid not in self.waited:
                self.waited[rid] = [entered, 0, 0]
            waiting[rid] = ids[rid]
        return waiting

    def after_admission(self, batch: Any, waiting: dict[str, int]) -> None:
        """Charge what `batch` admitted to each account of `waiting` that still waits; close
        the accounts of those it admitted."""
        admitted = adapter.admitted(batch)
        self.counters.plain_admitted += sum(1 for a in admitted if stream_of(a.rid) is None)
        ids = {a.obj_id for a in admitted}
        spec = sum(a.extend_len for a in admitted if self._speculative(a.rid))
        c = self.counters
        streams = self.streams
        step = sum(a.extend_len for a in admitted if is_speculative_work(a.rid, streams))
        c.speculative_step_max = max(c.speculative_step_max, step)
        volatile = sum(
            a.extend_len for a in admitted if self._speculative(a.rid) and is_volatile(a.rid)
        )
        committed = [
            (self.waited.get(a.rid, [0.0])[0], a.extend_len)
            for a in admitted
            if not self._speculative(a.rid)
        ]
        for rid, obj_id in waiting.items():
            if rid in self.spec_waited:  # a speculative turn: volatile work ahead of it
                if obj_id in ids:
                    c.volatile_ahead_max = max(c.volatile_ahead_max, self.spec_waited.pop(rid))
                else:
                    self.spec_waited[rid] += volatile
                continue
            account = self.waited.get(rid)
            if account is None:
                continue
            if obj_id in ids:
                c.committed_admitted += 1
                c.speculative_ahead_max = max(c.speculative_ahead_max, int(account[1]))
                c.newer_committed_ahead_max = max(c.newer_committed_ahead_max, int(account[2]))
                del self.waited[rid]
                continue
            account[1] += spec
            account[2] += sum(n for entered, n in committed if entered > account[0])
        if len(self.waited) + len(self.spec_waited) > 4 * len(waiting) + 256:  # aborted
            self.waited = {rid: a for rid, a in self.waited.items() if rid in waiting}
            self.spec_waited = {rid: a for rid, a in self.spec_waited.items() if rid in waiting}
            self.promoted &= set(waiting)

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
            "publish_at_close": self.config.publish_at_close,
            "speculative_chunk": self.config.speculative_chunk,
            "preemption": self.preemption.name if self.preemption is not None else None,
            "profile": self.profile_path,
            "host_kv_capacity": self.host.capacity_tokens if self.host is not None else 0,
            "host_kv_used": self.host.used_tokens if self.host is not None else 0,
            "host_copies": len(self.host.entries) if self.host is not None else 0,
            "spec_reserve": (
                self.spec_reserve(scheduler, adapter.now()) if scheduler is not None else None
            ),
            "adapter_contract": self.contract,
            "finals_parked_now": len(self.parked),
        }
        if scheduler is not None:
            state.update(adapter.live_counts(scheduler))
            # data parallel: the streams whose turns reached this rank (stream ids: a session
            # key is the stream id, a dot, 16 random hex digits)
            seen = [key.rpartition(".")[0] for key in list(self.streams)[-SEEN_STREAMS:]]
            state["turn_streams"] = seen
        return state


#: most stream ids `export` lists in `turn_streams` (the latest)
SEEN_STREAMS = 256


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
