"""radix_ext.rollback on real SGLang objects (CPU, no engine, no mocks).

Each test builds a standalone `UnifiedRadixCache` over real pools, a streaming `Session` and a
`SessionSlot` whose row holds N allocated KV indices, as a finished first turn leaves them:
`[0, published)` is in the radix tree (the slot holds its lock), `[published, N)` is private.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import pytest
import torch
from sglang.srt.managers.schedule_batch import Req, ReqKvInfo
from sglang.srt.mem_cache.allocator import (
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.srt.session.session_controller import Session
from sglang.srt.session.streaming_session import SessionSlot

from radix_ext import RollbackResult, page_floor, rollback_streaming_session

POOL = 64  # KV pool tokens
SID = "stream-0"
set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))


@dataclass
class Stream:
    cache: UnifiedRadixCache
    session: Session
    slot: SessionSlot
    row: torch.Tensor  # the slot's req_to_token row as built (a copy)

    @property
    def avail(self) -> int:
        return self.cache.token_to_kv_pool_allocator.available_size()

    def drain(self) -> int:
        """Close the stream and evict the whole tree; returns the allocator's free size."""
        self.cache.release_session(SID)
        self.cache.evict(EvictParams(num_tokens=POOL))
        return self.avail


def make_stream(n: int = 12, published: int = 0, page_size: int = 1) -> Stream:
    """A streaming session after a finished turn of `n` tokens, `published` of them in the tree."""
    req_pool = ReqToTokenPool(4, 64, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(POOL, page_size, torch.float16, 1, 4, 1, "cpu", False)
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(POOL, torch.float16, "cpu", kv_pool, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(POOL, page_size, torch.float16, "cpu", kv_pool, False)
    cache = UnifiedRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=req_pool,
            token_to_kv_pool_allocator=alloc,
            page_size=page_size,
            tree_components=(ComponentType.FULL,),
        )
    )
    indices = alloc.alloc(-(-n // page_size) * page_size)[:n]  # whole pages, like alloc_extend
    kv = ReqKvInfo()
    [kv.req_pool_idx] = req_pool.alloc_rows(1)
    req_pool.write((kv.req_pool_idx, slice(0, n)), indices.to(torch.int32))
    kv.kv_allocated_len = kv.kv_committed_len = n
    slot = SessionSlot(kv=kv)
    if published:
        key = RadixKey(array("q", range(100, 100 + published)))
        result = cache.insert(InsertParams(key=key, value=indices[:published].clone()))
        slot.lock = cache.lock(result.last_device_node)
        kv.cache_protected_len = kv.cache_inserted_len = published
    cache.session.slots[SID] = slot
    session = Session(1 << 20, SID, streaming=True)
    session.committed_origin_len = session.committed_unpadded_len = session.committed_fill_len = n
    return Stream(cache, session, slot, req_pool.req_to_token[kv.req_pool_idx].clone())


def next_turn(s: Stream, keep: int, delta: list[int]) -> Req:
    """The next prefill-only turn (prompt = kept tokens + delta), matched at admission."""
    ids = array("q", [*range(100, 100 + keep), *delta])
    req = Req("turn-1", None, ids, SamplingParams(max_new_tokens=0), session=s.session)
    req.init_next_round_input(s.cache)  # -> UnifiedRadixCache.match_prefix
    return req


def committed_lens(session: Session) -> tuple:
    return tuple(getattr(session, f"committed_{x}_len") for x in ("origin", "unpadded", "fill"))


def kv_lens(kv: ReqKvInfo) -> tuple[int, int, int]:
    return kv.kv_allocated_len, kv.kv_committed_len, kv.cache_protected_len


def test_page_floor():
    assert [page_floor(n, 4) for n in (0, 3, 4, 7, 8, 10)] == [0, 0, 4, 4, 8, 8]
    assert page_floor(7, 1) == 7


@pytest.mark.parametrize("keep", [5, 7, 11])
def test_private_tail_is_freed_at_once_and_slot_stays(keep):
    s = make_stream(n=12, published=4)
    before = s.avail
    assert (s.cache.protected_size(), s.cache.evictable_size()) == (4, 0)

    result = rollback_streaming_session(s.session, s.cache, keep)

    assert result == RollbackResult(keep, 12 - keep, 12 - keep, False)
    assert s.avail == before + 12 - keep
    assert s.cache.session.slots[SID] is s.slot and s.slot.kv.holds_kv
    assert kv_lens(s.slot.kv) == (keep, keep, 4)
    assert committed_lens(s.session) == (keep, keep, keep)
    row = s.cache.req_to_token_pool.req_to_token[s.slot.kv.req_pool_idx]
    assert torch.equal(row[:keep], s.row[:keep])  # the kept KV indices are untouched
    assert (s.cache.protected_size(), s.cache.evictable_size()) == (4, 0)  # still locked
    assert s.drain() == POOL  # nothing leaked, nothing freed twice


@pytest.mark.parametrize("keep", [1, 5, 7, 8])  # 8 == published: released too
def test_rollback_into_published_prefix_releases_slot(keep):
    s = make_stream(n=12, published=8)
    before, rows_before = s.avail, s.cache.req_to_token_pool.available_size()

    result = rollback_streaming_session(s.session, s.cache, keep)

    assert result == RollbackResult(keep, 12 - keep, 4, True)
    assert SID not in s.cache.session.slots and not s.slot.kv.holds_kv
    assert s.avail == before + 4  # only the private tail [8, 12)
    assert s.cache.req_to_token_pool.available_size() == rows_before + 1
    # The published 8 tokens stay in the tree, now unlocked: evictable, not freed.
    assert (s.cache.protected_size(), s.cache.evictable_size()) == (0, 8)
    assert committed_lens(s.session) == (keep, keep, keep)
    assert s.drain() == POOL


@pytest.mark.parametrize("published", [0, 4])
def test_keep_zero_releases_slot(published):
    s = make_stream(n=12, published=published)
    before = s.avail

    result = rollback_streaming_session(s.session, s.cache, 0)

    assert result == RollbackResult(0, 12, 12 - published, True)
    assert SID not in s.cache.session.slots
    assert s.avail == before + 12 - published
    assert s.cache.evictable_size() == published and s.cache.protected_size() == 0
    assert committed_lens(s.session) == (0, 0, 0)
    assert s.drain() == POOL


@pytest.mark.parametrize("keep_len", [12, 13, 1000])
def test_keep_beyond_committed_is_clamped(keep_len):
    s = make_stream(n=12, published=4)
    before = s.avail

    result = rollback_streaming_session(s.session, s.cache, keep_len)

    assert result == RollbackResult(12, 0, 0, False)
    assert s.avail == before
    assert s.cache.session.slots[SID] is s.slot
    assert kv_lens(s.slot.kv) == (12, 12, 4)
    assert committed_lens(s.session) == (12, 12, 12)
    assert s.drain() == POOL


@pytest.mark.parametrize(
    "keep_len, kept, freed_pages, released",
    [
        (9, 8, 1, False),  # [8, 10): the partial last page
        (7, 4, 2, True),  # floored to 4 == published: released; pages [4, 12) freed
        (4, 4, 2, True),
        (3, 0, 2, True),  # floored to 0: release; the published page stays in the tree
    ],
)
def test_paged_keep_is_floored_and_whole_pages_freed(keep_len, kept, freed_pages, released):
    s = make_stream(n=10, published=4, page_size=4)
    before = s.avail
    assert before == POOL - 12  # 3 pages

    result = rollback_streaming_session(s.session, s.cache, keep_len)

    assert result.kept == kept and result.kept % 4 == 0
    assert result.invalidated == 10 - kept
    assert result.freed_private == 10 - max(kept, 4)  # row tokens past the kept/published part
    assert result.released_slot is released
    assert s.avail == before + 4 * freed_pages
    assert committed_lens(s.session) == (kept, kept, kept)
    if released:
        assert SID not in s.cache.session.slots
        assert (s.cache.protected_size(), s.cache.evictable_size()) == (0, 4)
    else:
        assert kv_lens(s.slot.kv) == (kept, kept, 4)
        assert (s.cache.protected_size(), s.cache.evictable_size()) == (4, 0)
    assert s.drain() == POOL


def test_no_finished_turn_is_a_noop():
    s = make_stream(n=12, published=4)
    s.session.committed_origin_len = s.session.committed_unpadded_len = None
    s.session.committed_fill_len = None
    before = s.avail

    assert rollback_streaming_session(s.session, s.cache, 3) == RollbackResult(0, 0, 0, False)
    assert s.avail == before
    assert s.cache.session.slots[SID] is s.slot
    assert kv_lens(s.slot.kv) == (12, 12, 4)
    assert committed_lens(s.session) == (None, None, None)


def test_slot_already_released_only_lowers_committed_lengths():
    s = make_stream(n=12, published=4)
    s.cache.release_session(SID)  # e.g. an aborted turn handed the record back
    before = s.avail

    assert rollback_streaming_session(s.session, s.cache, 6) == RollbackResult(6, 6, 0, False)
    assert s.avail == before
    assert committed_lens(s.session) == (6, 6, 6)


def test_non_streaming_and_inflight_sessions_are_rejected():
    s = make_stream(n=12, published=4)
    before = s.avail
    with pytest.raises(ValueError):
        rollback_streaming_session(Session(1 << 20, "plain", streaming=False), s.cache, 3)
    s.session._inflight = True
    with pytest.raises(RuntimeError):
        rollback_streaming_session(s.session, s.cache, 3)
    assert s.avail == before
    assert kv_lens(s.slot.kv) == (12, 12, 4)
    assert committed_lens(s.session) == (12, 12, 12)


@pytest.mark.parametrize("keep, delta, prefix", [(7, [1, 2], 7), (8, [], 7), (5, [5], 5)])
def test_next_turn_borrows_the_rolled_back_slot(keep, delta, prefix):
    s = make_stream(n=12, published=4)
    rollback_streaming_session(s.session, s.cache, keep)
    req = next_turn(s, keep, delta)  # stock StreamingSession.try_match_prefix
    assert req.kv is s.slot.kv and req.prefix_len == prefix
    assert kv_lens(s.slot.kv) == (prefix, prefix, 4)
    assert s.avail == POOL - 12 + 12 - prefix


def test_next_turn_after_release_rematches_the_tree():
    s = make_stream(n=12, published=8)
    rollback_streaming_session(s.session, s.cache, 5)
    req = next_turn(s, 5, [1])
    assert req.kv is not s.slot.kv and req.prefix_len == 5


def test_rollback_to_published_boundary_then_truncating_turn():
    # keep == cache_protected_len must release the slot: a next turn matches keep - 1 tokens,
    # and SGLang asserts a session's match never shrinks below its published prefix.
    s = make_stream(n=12, published=4)
    rollback_streaming_session(s.session, s.cache, 4)  # next_turn(held, held[:4]) -> delta []
    req = next_turn(s, 4, [])
    assert req.prefix_len == 3
