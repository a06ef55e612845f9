"""The one module that reads and writes SGLang's scheduler internals.

Everything the stream scheduler knows of SGLang's `Scheduler` comes from `snapshot()`; every
change it makes goes through `apply()` and the few writes below. The decisions between them
are pure (`sched/decide.py`). What is read and written:
- the waiting queue (`Scheduler.waiting_queue`): each request's rid, input length, output
  budget, queue-entry time (`time_stats.wait_queue_entry_time`) and prefix-cache hit
  (`Req.prefix_len`, as SGLang last matched it); the queue's order is written back, and
  held speculative turns are taken out of it for one admission and put back after;
- the running batch (`Scheduler.running_batch.reqs`): the KV its requests will still take,
  counted as SGLang's `PrefillAdder` counts it (clipped output left x `new_token_ratio`);
- the chunked request (`Scheduler.chunked_req`): its next chunk;
- the pool (`token_to_kv_pool_allocator.available_size()`, `tree_cache.evictable_size()`,
  and its bytes per token, `get_kvcache().get_kv_size_bytes()`, which size the host pool);
- session slots (`tree_cache.session.slots`: committed and allocated lengths, whether a turn
  is in flight) and sessions (`session_controller`);
- a stream's final turn sent while its turn before is in flight: the session's in-flight
  flag and last finished turn (`Session._inflight`, `req_nodes`), the turn's
  `session_params.rid` (read and reset); the turn is handed to
  `Scheduler.handle_generate_request` once the turn before has ended;
- KV release (`tree_cache.release_session`), copy to host and back (`radix_ext.swap`, under
  the namespace of the session's last turn: `Req.extra_key`, `Req.cache_salt`), rollback
  of a session's committed lengths (`radix_ext.rollback`), aborting a waiting request
  (`Scheduler.abort_request`), and a closing stream's KV handed to the radix tree before
  SGLang's close releases it (`SessionController.sessions`, `tree_cache`; `radix_ext.publish`);
- the hooks' own targets: a turn's `session_params` (read and reset), the scheduler's request
  dispatcher, `get_internal_state`'s result.
`check_contract()` runs every read against a live scheduler and names what is missing; its
result is exported (`adapter_contract` in `s2l_sched`) and tested, so an SGLang upgrade that
moves any of these fails one test that points here.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable
from typing import Any, NamedTuple

from s2l_sglang.rid import parts, stream_of
from s2l_sglang.sched.decide import Actions, HostCopy, SlotView, Snapshot, WaitingReq


def _clip_max_new() -> int:
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    return int(CLIP_MAX_NEW_TOKENS)


# ---- reads --------------------------------------------------------------------------------


def now() -> float:
    """SGLang's clock for queue-entry times."""
    return time.perf_counter()


def entered(req: Any, default: float) -> float:
    """When `req` entered SGLang's waiting queue; `default` if unset."""
    return getattr(getattr(req, "time_stats", None), "wait_queue_entry_time", 0.0) or default


def waiting_rids(scheduler: Any) -> list[str]:
    return [req.rid for req in scheduler.waiting_queue]


def waiting_entries(scheduler: Any, at: float) -> list[tuple[str, float]]:
    """(rid, queue-entry time) of each waiting request, in queue order."""
    return [(req.rid, entered(req, at)) for req in scheduler.waiting_queue]


def has_work_waiting(scheduler: Any) -> bool:
    """Something waits for prefill: a queued request or a chunked one mid-prefill."""
    return bool(scheduler.waiting_queue) or scheduler.chunked_req is not None


def slots(scheduler: Any) -> dict[str, SlotView]:
    """The session slots that hold KV."""
    out = {}
    controller = scheduler.session_controller
    for sid, slot in scheduler.tree_cache.session.slots.items():
        kv = slot.kv
        if not kv.holds_kv:
            continue
        session = controller.get(sid)
        inflight = session is None or bool(session._inflight)
        out[sid] = SlotView(sid, kv.kv_committed_len, kv.kv_allocated_len, inflight)
    return out


def waiting(scheduler: Any, at: float, evictable: int = 0) -> tuple[WaitingReq, ...]:
    """The waiting queue. A request's `prefix_free` is its prefix hit, at most `evictable`
    (the prefix cache's evictable tokens): an upper bound of what its admission's lock takes
    out of the free KV (exact when no other request holds its prefix). A turn of a stream
    whose session slot holds KV gets 0: its prefix is that slot, which the session already
    locks (SGLang's virtual node)."""
    clip = _clip_max_new()
    slot_of = scheduler.tree_cache.session.slots
    out = []
    for req in scheduler.waiting_queue:
        sid, volatile, speculative = parts(req.rid)
        slot = slot_of.get(sid) if sid else None
        hit = int(getattr(req, "prefix_len", 0) or 0)
        borrowed = slot is not None and req.kv is slot.kv
        out.append(
            WaitingReq(
                rid=req.rid,
                prompt_len=len(req.origin_input_ids),
                prefix_hit=hit,
                max_new=min(req.sampling_params.max_new_tokens or 0, clip),
                entered=entered(req, at),
                borrowed=borrowed,
                prefix_free=0 if slot is not None and slot.kv.holds_kv else min(hit, evictable),
                sid=sid,
                volatile=volatile,
                speculative=speculative,
            )
        )
    return tuple(out)


def running_reserve(scheduler: Any, running_batch: Any = None) -> int:
    """KV the running batch (the one `get_new_batch_prefill` is given, else the scheduler's)
    will still take, as SGLang's `PrefillAdder` reserves it."""
    batch = running_batch if running_batch is not None else scheduler.running_batch
    reqs = getattr(batch, "reqs", None) or []
    if not reqs:
        return 0
    clip, ratio = _clip_max_new(), new_token_ratio(scheduler)
    total = 0.0
    for r in reqs:
        params = r.sampling_params
        left = min((params.max_new_tokens or 0) - len(r.output_ids), clip)
        total += left * (1.0 if params.ignore_eos else ratio)
    return int(total)


def new_token_ratio(scheduler: Any) -> float:
    """SGLang's estimate of how much of its output budget a running request will use."""
    return float(scheduler.new_token_ratio_tracker.current)


def chunked_next(scheduler: Any) -> int:
    """Tokens of the mid-prefill request's next chunk (0 when none)."""
    chunked = scheduler.chunked_req
    if chunked is None:
        return 0
    chunk = scheduler.chunked_prefill_size or 0
    held = chunked.kv.kv_allocated_len if chunked.kv.holds_kv else 0
    return max(0, min(len(chunked.full_untruncated_fill_ids) - held, chunk))


def host_copies(scheduler: Any, host: Any) -> tuple[HostCopy, ...]:
    if host is None or not host.entries:
        return ()
    controller = scheduler.session_controller
    return tuple(
        HostCopy(sid, entry.size, controller.get(sid) is not None, entry.restored)
        for sid, entry in host.entries.items()
    )


def admit_extra(scheduler: Any) -> int:
    """What `PrefillAdder.add_one_req` asks of the free KV beyond a request's extend and
    output budget: a page (its `per_req_token_overhead`), and 1 for its strict test
    (`total_tokens < remaining_total`)."""
    return int(scheduler.tree_cache.page_size) + 1


def snapshot(
    scheduler: Any, host: Any = None, running_batch: Any = None, stalled: int = 0
) -> Snapshot:
    """SGLang's scheduler state now, as `sched.decide` needs it (`stalled`: the caller's
    count of steps in a row that admitted nothing while nothing ran)."""
    at = now()
    available = int(scheduler.token_to_kv_pool_allocator.available_size())
    evictable = int(scheduler.tree_cache.evictable_size())
    free = available + evictable - running_reserve(scheduler, running_batch)
    return Snapshot(
        now=at,
        waiting=waiting(scheduler, at, evictable),
        slots=slots(scheduler),
        free_kv=free,
        available=available,
        chunked_next=chunked_next(scheduler),
        chunked_rid=scheduler.chunked_req.rid if scheduler.chunked_req is not None else "",
        host=host_copies(scheduler, host),
        host_free=host.free_tokens if host is not None else 0,
        admit_extra=admit_extra(scheduler),
        stalled=stalled,
    )


def stalled_step(scheduler: Any, batch: Any, running_batch: Any) -> bool:
    """A prefill step (`get_new_batch_prefill` gave `batch`) that admitted nothing while
    requests wait and nothing runs or is mid-prefill: nothing in SGLang will free KV."""
    if admitted(batch) or not scheduler.waiting_queue or scheduler.chunked_req is not None:
        return False
    batch_ = running_batch if running_batch is not None else scheduler.running_batch
    return not (getattr(batch_, "reqs", None) or [])


def open_sessions(scheduler: Any) -> set[str]:
    return set(scheduler.session_controller.sessions)


def live_counts(scheduler: Any) -> dict[str, Any]:
    """The KV pool's free and evictable tokens; what streams hold right now: open sessions
    and session slots (each pins KV); this scheduler's data-parallel rank; requests waiting
    (plain ones apart, and the streams with a turn waiting: stream ids, never session keys)
    and running (all of them)."""
    from sglang.srt.runtime_context import get_parallel

    found = getattr(getattr(scheduler.tree_cache, "session", None), "slots", {})
    keys = [stream_of(req.rid) for req in scheduler.waiting_queue]
    return {
        "kv_available": int(scheduler.token_to_kv_pool_allocator.available_size()),
        "kv_evictable": int(scheduler.tree_cache.evictable_size()),
        "open_sessions": len(scheduler.session_controller.sessions),
        "session_slots": len(found),
        "dp_rank": get_parallel().dp_rank or 0,
        "waiting_reqs": len(keys),
        "waiting_plain": sum(1 for k in keys if k is None),
        "waiting_streams": sorted({k.rpartition(".")[0] for k in keys if k}),
        "running_reqs": len(getattr(scheduler.running_batch, "reqs", None) or []),
    }


def _last_finished(session: Any) -> Any:
    """A streaming session's last finished turn (what its KV holds), or None."""
    if session is None or not session.req_nodes or session.committed_origin_len is None:
        return None
    [node] = session.req_nodes.values()
    return node.req


def committed_kv(scheduler: Any, sid: str) -> tuple[list[int], str | None, str | None]:
    """What stream `sid`'s session holds KV for, from its last finished turn: the token ids
    (its prompt and output, a kept-open stream's generated tokens included, up to the slot's
    committed length where the caller cuts them) and the radix key namespace they were
    computed under (`extra_key`, `cache_salt`: the key a copy of that KV goes back under)."""
    held = session(scheduler, sid)
    return (_held_ids(held), *_namespace(_last_finished(held)))


def _namespace(req: Any) -> tuple[str | None, str | None]:
    return getattr(req, "extra_key", None), getattr(req, "cache_salt", None)


def _held_ids(session: Any) -> list[int]:
    """The token ids a streaming session's next turn is appended to, whose KV its slot holds
    (up to the slot's committed length): its last finished turn's committed prompt and output
    (SGLang's `Session._share_token_arrays` builds the turn's request so); [] before a turn
    has finished."""
    last = _last_finished(session)
    if last is None:
        return []
    return [
        *last.origin_input_ids[: session.committed_origin_len],
        *last.output_ids[: last.sampling_params.max_new_tokens],
    ]


class Admitted(NamedTuple):
    rid: str
    extend_len: int
    obj_id: int  # identity of SGLang's request (a rid can be reused after an abort)


def admitted(batch: Any) -> list[Admitted]:
    """The requests a prefill batch admitted (`get_new_batch_prefill`'s result)."""
    batch = getattr(batch, "batch_to_run", batch)  # SGLang returns a NextBatchPlan
    if batch is None:
        return []
    return [Admitted(r.rid, int(r.extend_len), id(r)) for r in batch.reqs]


def waiting_ids(scheduler: Any) -> dict[str, int]:
    """rid -> identity of each waiting request (what `admitted` matches)."""
    return {req.rid: id(req) for req in scheduler.waiting_queue}


def model_dtype(scheduler: Any) -> str:
    return str(scheduler.model_config.dtype).replace("torch.", "")


def server_args(scheduler: Any) -> Any:
    return scheduler.server_args


def max_total_tokens(scheduler: Any) -> int:
    return int(scheduler.max_total_num_tokens)


def kv_bytes_per_token(scheduler: Any) -> int:
    """Bytes of KV one token takes in the device pool (every layer, K and V; for SmolLM2-135M
    in bfloat16 30 x 2 x 3 x 64 x 2 = 23,040): the pool's buffers over their rows, which are
    `size + page_size` (SGLang keeps a padding page)."""
    pool = scheduler.token_to_kv_pool_allocator.get_kvcache()
    size = pool.get_kv_size_bytes()
    total = int(sum(size)) if isinstance(size, tuple) else int(size)  # numpy ints, at times
    return max(1, total // (int(pool.size) + int(pool.page_size)))


def metrics_enabled(scheduler: Any) -> bool:
    return bool(getattr(scheduler, "enable_metrics", False))


def is_waiting_queue(scheduler: Any, queue: Any) -> bool:
    return scheduler is not None and queue is scheduler.waiting_queue


# ---- writes -------------------------------------------------------------------------------


def reorder(scheduler: Any, order: Iterable[str]) -> None:
    """Put the waiting queue in `order` (rids; unknown ones skipped)."""
    by_rid = {req.rid: req for req in scheduler.waiting_queue}
    scheduler.waiting_queue[:] = [by_rid[rid] for rid in order if rid in by_rid]


def hold_out(scheduler: Any, rids: Iterable[str]) -> list[Any]:
    """Take the waiting requests `rids` out of the waiting queue, for one admission; the
    requests, for `put_back`."""
    out = set(rids)
    queue = scheduler.waiting_queue
    held = [req for req in queue if req.rid in out]
    queue[:] = [req for req in queue if req.rid not in out]
    return held


def put_back(scheduler: Any, reqs: list[Any]) -> None:
    """Return requests `hold_out` took to the end of the waiting queue (SGLang replaces the
    queue's list after an admission: this is the one in force); the next `calc_priority`
    orders them again."""
    scheduler.waiting_queue.extend(reqs)


class Applied(NamedTuple):
    dropped: tuple[Any, ...] = ()  # radix_ext.swap.SwappedKV per host copy dropped
    swapped_in: tuple[Any, ...] = ()  # radix_ext.swap.SwapInResult per swap-in
    preempted: tuple[tuple[str, str, int], ...] = ()  # (sid, mode done, tokens)


def apply(scheduler: Any, actions: Actions, host: Any = None) -> Applied:
    """Carry out `actions` in order: drops, preemptions, swap-ins (a swap-in takes its KV
    from the allocator, which the preemptions have just given room: in the other order a
    head whose own copy comes back beside a victim found no room, lost its copy and was
    prefilled again). A swap that the host pool declines (pages > 1, no room) is done as a
    recompute."""
    gone = (host.drop(sid) for sid in actions.drop_copies) if host is not None else ()
    dropped = tuple(entry for entry in gone if entry is not None)
    done = []
    cache = scheduler.tree_cache
    for p in actions.preempt:
        if p.sid not in cache.session.slots:
            continue
        if p.mode == "swap" and host is not None:
            tokens, extra_key, cache_salt = committed_kv(scheduler, p.sid)
            n = host.swap_out(cache, p.sid, tokens, extra_key=extra_key, cache_salt=cache_salt)
            if n:
                done.append((p.sid, "swap", n))
                continue
        cache.release_session(p.sid)
        done.append((p.sid, "recompute", p.tokens))
    swapped = tuple(host.swap_in(cache, sid) for sid in actions.swap_in)
    return Applied(dropped, swapped, tuple(done))


def abort_waiting(scheduler: Any, rid: str, message: str) -> None:
    """Abort waiting request `rid` through SGLang's own abort path."""
    from sglang.srt.managers.io_struct import AbortReq

    reason = {"type": "abort", "message": message}
    scheduler.abort_request(AbortReq(rid=rid, finished_reason=reason))


def add_handlers(scheduler: Any, pairs: list[tuple[type, Any]]) -> None:
    """Handle our request types in the scheduler's dispatcher."""
    from sglang.utils import TypeBasedDispatcher

    scheduler._request_dispatcher += TypeBasedDispatcher(pairs)


def export_state(result: Any, key: str, value: Any) -> None:
    """Add `value` to `get_internal_state`'s result under `key`."""
    result.internal_state[key] = value


# ---- a streaming session's turn (Session.create_req) --------------------------------------


def is_streaming(session: Any) -> bool:
    return bool(session.streaming)


def take_replace(req: Any) -> int | None:
    """A turn's update-mode replace: its kept-prefix offset, with `replace` and `offset`
    taken off its `session_params` (SGLang's streaming sessions reject them); None if the
    turn appends."""
    params = req.session_params
    if params is None or not params.replace:
        return None
    plain_append(req)
    return params.offset or 0


def rollback(session: Any, scheduler: Any, keep: int) -> Any:
    """Roll the session's KV back to its first `keep` committed tokens (radix_ext)."""
    from radix_ext import rollback_streaming_session

    return rollback_streaming_session(session, scheduler.tree_cache, keep)


def publish_at_close(controller: Any, key: str) -> Any:
    """Before SGLang's `SessionController._close(key)` releases a stream's session: hand the
    KV its slot holds (the last finished turn's prompt and output) to the radix tree
    (`radix_ext.publish`). Nothing for a session that is not one of our streams' (SGLang's
    own streaming sessions keep SGLang's behaviour), or whose close is deferred (a turn in
    flight or unfinished: the close runs again once it ends). Returns the
    `radix_ext.PublishResult`, or None when it does not apply."""
    from radix_ext import publish_session_kv

    held = controller.sessions.get(key)
    if held is None or not held.streaming or held._inflight:
        return None
    last = _last_finished(held)
    if last is None or not last.finished() or stream_of(last.rid) is None:
        return None
    extra_key, cache_salt = _namespace(last)
    return publish_session_kv(
        controller.tree_cache,
        key,
        _held_ids(held),  # cut to the slot's committed length there
        extra_key=extra_key,
        cache_salt=cache_salt,
    )


def finish_turn_with_abort(new_req: Any, tokenizer: Any, failure: str | None) -> None:
    """Give SGLang's new request its tokenizer back, and abort it with `failure` if set."""
    new_req.tokenizer = tokenizer
    if failure is not None and new_req.to_finish is None:
        new_req.set_finish_with_abort(failure)


# ---- a stream's final turn sent while its turn before runs (pipelined finish) -------------


def session(scheduler: Any, key: str) -> Any:
    """SGLang's session `key`, or None."""
    return scheduler.session_controller.get(key)


def turn_in_flight(session: Any) -> bool:
    """A streaming session with a turn created and not yet finished or aborted."""
    return bool(session._inflight)


def last_turn_rid(session: Any) -> str | None:
    """The rid of the streaming session's last finished turn (what its KV holds), or None."""
    return next(iter(session.req_nodes), None)


def take_after(recv_req: Any) -> str | None:
    """A turn's `session_params.rid` (the turn it was built on), taken off its session
    parameters (SGLang's streaming sessions ignore it); None if unset."""
    params = recv_req.session_params
    if params is None or params.rid is None:
        return None
    after, params.rid = params.rid, None
    return after


def merge_queued_turn(scheduler: Any, recv_req: Any, rid: str, message: str) -> bool:
    """A final turn `recv_req` built on stream turn `rid` (its `session_params.rid`, already
    taken off), arriving while `rid` still waits in the queue without its session's KV slot:
    abort `rid` (with `message`; SGLang ends it as if it never ran, and the session holds
    the `base` tokens `rid` was appended to, after its rollback) and make `recv_req` carry
    the tokens of `rid` that it keeps, so that the final turn is built on what the session
    holds. True if done; False (nothing changed) if `rid` does not wait, or has borrowed
    its slot (an abort would drop the slot).

    The final turn keeps `keep` tokens of `rid`'s target (its `offset` when it rolls back,
    else all of them): at or past `base`, it appends `target[base:keep]` before its own
    tokens; below `base` its rollback to `keep` stands as it is."""
    req = next((r for r in scheduler.waiting_queue if r.rid == rid), None)
    if req is None:
        return False
    sid = stream_of(rid)
    slot = scheduler.tree_cache.session.slots.get(sid)
    if slot is not None and req.kv is slot.kv:
        return False
    base = len(_held_ids(session(scheduler, sid)))
    target = req.origin_input_ids[:]  # a copy: SGLang trims the shared array on abort
    params = recv_req.session_params
    keep = (params.offset or 0) if params.replace else len(target)
    abort_waiting(scheduler, rid, message)
    if keep >= base:
        # the type SGLang gave it (array("q")): a session's first request keeps it as is
        ids = recv_req.input_ids
        head = list(target[base:keep])
        merged = array(ids.typecode, head) if isinstance(ids, array) else head
        merged.extend(ids)
        recv_req.input_ids = merged
        plain_append(recv_req)
    return True


def plain_append(recv_req: Any) -> None:
    """Drop a turn's update-mode rollback (`replace`, `offset`): a turn that will be aborted
    before it runs must not roll its session back."""
    from sglang.srt.managers.io_struct import SessionParams

    recv_req.session_params = SessionParams(id=recv_req.session_params.id)


def abort_matches(abort_req: Any, rid: str) -> bool:
    """Whether SGLang's `abort_request(abort_req)` aborts request `rid` (a prefix match)."""
    return bool(abort_req.abort_all) or rid.startswith(abort_req.rid)


def abort_message(abort_req: Any) -> str:
    reason = getattr(abort_req, "finished_reason", None) or {}
    return str(reason.get("message") or "aborted")


# ---- the contract -------------------------------------------------------------------------


def _req_has_namespace() -> bool:
    """SGLang's `Req` takes the radix key's namespace fields `committed_kv` reads (read with a
    default there: a renamed field would otherwise read as no namespace, silently)."""
    import inspect

    from sglang.srt.managers.schedule_batch import Req

    return {"extra_key", "cache_salt"} <= set(inspect.signature(Req.__init__).parameters)


def check_contract(scheduler: Any) -> list[str]:
    """Run every read above against the live `scheduler`; the names of those that fail
    (empty: this SGLang has everything the adapter uses)."""
    failures = []
    checks = {
        "waiting_queue": lambda: isinstance(scheduler.waiting_queue, list),
        "snapshot": lambda: isinstance(snapshot(scheduler), Snapshot),
        "running_batch.reqs": lambda: isinstance(
            getattr(scheduler.running_batch, "reqs", []), list
        ),
        "new_token_ratio": lambda: new_token_ratio(scheduler) >= 0,
        "chunked_prefill_size": lambda: chunked_next(scheduler) >= 0,
        "session.slots": lambda: isinstance(scheduler.tree_cache.session.slots, dict),
        "session_controller.sessions": lambda: open_sessions(scheduler) is not None,
        "release_session": lambda: callable(scheduler.tree_cache.release_session),
        "session_controller.tree_cache": lambda: (
            scheduler.session_controller.tree_cache is scheduler.tree_cache
        ),
        "tree_cache.insert/lock/unlock/path_device_indices": lambda: all(
            callable(getattr(scheduler.tree_cache, name))
            for name in ("insert", "lock", "unlock", "path_device_indices")
        ),
        "abort_request": lambda: callable(scheduler.abort_request),
        "page_size": lambda: int(scheduler.tree_cache.page_size) >= 1,
        "live_counts": lambda: live_counts(scheduler)["dp_rank"] >= 0,
        "model_dtype": lambda: bool(model_dtype(scheduler)),
        "max_total_tokens": lambda: max_total_tokens(scheduler) > 0,
        "kv_bytes_per_token": lambda: kv_bytes_per_token(scheduler) > 1,
        "request_dispatcher": lambda: scheduler._request_dispatcher is not None,
        "CLIP_MAX_NEW_TOKENS": lambda: _clip_max_new() > 0,
        "Req.extra_key/cache_salt (namespace)": _req_has_namespace,
    }
    for name, check in checks.items():
        try:
            if not check():
                failures.append(name)
        except Exception as exc:  # the point: name what this SGLang lacks
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    return failures
