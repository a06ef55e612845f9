"""Roll a streaming session's KV back to a kept prefix (update mode and token re-alignment).

A streaming session (`sglang.srt.session.streaming_session`) owns a KV row (its `SessionSlot`)
between turns. Index ranges of that row, with N committed tokens and a kept prefix K <= N:

    [0, cache_protected_len)   published to the radix tree (shared; the slot holds a tree lock)
    [0, K)                     kept: the next turn reuses it
    [K, N)                     stale: freed when the next turn matches its prefix (private part),
                               or merely unheld (published part, which other requests may share)

Two cases, as in SGLang's own session code:
- K > cache_protected_len: only private KV is stale. Lower the session's committed lengths and
  the slot's `kv_committed_len` to K; the stock `StreamingSession.try_match_prefix` then frees
  `[K, allocated)` before the next turn writes its new suffix into the same row.
- K <= cache_protected_len (a next turn matches at most K - 1 tokens of the row, and SGLang
  asserts a session's match never shrinks below its published prefix): the rollback reaches into the published prefix. Release the slot
  (`release_session` frees the private tail and drops the tree lock); the next turn re-matches
  `[0, K)` from the tree and takes a new slot. Tree nodes stay for whoever shares them and are
  otherwise ordinary LRU entries.
With page_size > 1, K is floored to a page boundary: the partial page is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RollbackResult:
    kept: int  # tokens whose KV the next turn reuses
    invalidated: int  # committed tokens the stream no longer holds (N - kept)
    freed_private: int  # of those, private KV tokens returned to the pool
    released_slot: bool  # True when the rollback reached into the published prefix


def page_floor(n: int, page_size: int) -> int:
    return n - n % page_size if page_size > 1 else n


def rollback_streaming_session(session: Any, cache: Any, keep_len: int) -> RollbackResult:
    """Roll `session` (a streaming `Session`) back to its first `keep_len` committed tokens.

    `cache` is the scheduler's `UnifiedRadixCache`. Must be called between turns (no turn of
    this session in flight). Returns what was kept and invalidated.
    """
    if not session.streaming:
        raise ValueError("rollback applies to streaming sessions only")
    if session._inflight:
        raise RuntimeError(f"session {session.session_id} has a turn in flight")
    committed = session.committed_origin_len
    if committed is None:  # no turn has finished: nothing is held
        return RollbackResult(0, 0, 0, False)
    keep = page_floor(max(0, min(keep_len, committed)), cache.page_size)

    slot = cache.session.slots.get(session.session_id)
    freed = 0
    released = False
    if slot is not None and slot.kv.holds_kv:
        if keep > slot.kv.cache_protected_len:
            freed = max(0, slot.kv.kv_allocated_len - keep)
            # Free now rather than at the next match, so the pool sees it at once.
            _free_tail(cache, slot.kv, keep)
        else:
            freed = max(0, slot.kv.kv_allocated_len - slot.kv.cache_protected_len)
            cache.release_session(session.session_id)
            released = True

    session.committed_origin_len = keep
    session.committed_unpadded_len = keep
    session.committed_fill_len = keep
    return RollbackResult(keep, committed - keep, freed, released)


def _free_tail(cache: Any, kv: Any, keep: int) -> None:
    """Free the row's KV in [keep, allocated) (page-aligned) and shrink the row to `keep`."""
    start = keep
    if cache.page_size > 1:
        start = -(-keep // cache.page_size) * cache.page_size
    if kv.kv_allocated_len > start:
        cache.free_kv_row(kv, [(start, kv.kv_allocated_len)])
    kv.kv_allocated_len = keep
    kv.kv_committed_len = min(kv.kv_committed_len, keep)
    kv.clamp_evicted_seqlens(keep)
