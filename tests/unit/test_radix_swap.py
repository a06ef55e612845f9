"""radix_ext.swap on real SGLang pools (CPU, no engine, no mocks): swap-out copies a stream's KV
to host memory and releases its slot; swap-in puts exactly that KV back into the radix tree."""

from __future__ import annotations

from array import array

import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from radix_ext.swap import HostKVPool, SwapInResult
from tests.unit.test_radix_ext import POOL, SID, Stream, make_stream

TOKENS = list(range(100, 112))  # the 12 tokens `make_stream` holds


def fill_kv(s: Stream) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct K/V values in the stream's rows; returns them (tokens x heads x dim)."""
    pool = s.cache.token_to_kv_pool_allocator.get_kvcache()
    idx = s.row[:12].to(torch.int64)
    k = torch.arange(12 * 4, dtype=torch.float16).view(12, 1, 4)
    pool.k_buffer[0][idx] = k
    pool.v_buffer[0][idx] = -k
    return k, -k


def tree_kv(
    s: Stream, tokens: list[int], salt: str | None = None
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(matched length, K, V) the radix tree gives for `tokens` (in namespace `salt`)."""
    key = RadixKey(array("q", tokens), cache_salt=salt)
    match = s.cache.match_prefix(MatchPrefixParams(key=key))
    idx = s.cache.path_device_indices(match.last_device_node)[: match.device_prefix_len]
    pool = s.cache.token_to_kv_pool_allocator.get_kvcache()
    idx = idx.to(torch.int64)
    return int(match.device_prefix_len), pool.k_buffer[0][idx], pool.v_buffer[0][idx]


def test_swap_out_copies_and_releases_the_slot():
    s = make_stream(n=12, published=4)
    k, v = fill_kv(s)
    host = HostKVPool(64)
    before = s.avail

    assert host.swap_out(s.cache, SID, TOKENS) == 12

    assert SID not in s.cache.session.slots and SID in host
    assert s.avail == before + 8  # the private tail; the published 4 stay as LRU cache
    assert s.cache.evictable_size() == 4 and s.cache.protected_size() == 0
    assert host.used_tokens == 12 and host.free_tokens == 52
    [[(k_cpu, v_cpu)]] = host.entries[SID].kv_cpu
    assert torch.equal(k_cpu, k) and torch.equal(v_cpu, v)
    assert s.drain() == POOL


def test_swap_in_after_eviction_restores_the_exact_kv():
    s = make_stream(n=12, published=4)
    k, v = fill_kv(s)
    host = HostKVPool(64)
    host.swap_out(s.cache, SID, TOKENS)
    s.cache.evict(EvictParams(num_tokens=POOL))  # LRU took the published prefix too
    assert s.avail == POOL and tree_kv(s, TOKENS)[0] == 0

    assert host.swap_in(s.cache, SID) == SwapInResult(restored=12, reused=0, dropped=False)

    # the host copy stays, marked, until the stream holds its slot again
    assert SID in host and host.entries[SID].restored and s.avail == POOL - 12
    matched, k_tree, v_tree = tree_kv(s, TOKENS)
    assert matched == 12 and torch.equal(k_tree, k) and torch.equal(v_tree, v)
    assert s.cache.evictable_size() == 12  # unlocked: the next turn's match takes it
    s.cache.evict(EvictParams(num_tokens=POOL))
    assert s.avail == POOL


def test_swap_in_copies_only_what_the_tree_lost():
    s = make_stream(n=12, published=4)
    k, v = fill_kv(s)
    host = HostKVPool(64)
    host.swap_out(s.cache, SID, TOKENS)
    assert s.avail == POOL - 4

    assert host.swap_in(s.cache, SID) == SwapInResult(restored=8, reused=4, dropped=False)

    assert s.avail == POOL - 12
    matched, k_tree, v_tree = tree_kv(s, TOKENS)
    assert matched == 12 and torch.equal(k_tree, k) and torch.equal(v_tree, v)
    s.cache.evict(EvictParams(num_tokens=POOL))
    assert s.avail == POOL


def test_swap_in_without_room_drops_the_copy_and_leaks_nothing():
    s = make_stream(n=12, published=0)
    fill_kv(s)
    host = HostKVPool(64)
    host.swap_out(s.cache, SID, TOKENS)
    hog = s.cache.token_to_kv_pool_allocator.alloc(POOL - 2)  # not in the tree: not evictable

    assert host.swap_in(s.cache, SID) == SwapInResult(restored=0, reused=0, dropped=True)

    assert SID not in host and s.avail == 2  # a copy the pool cannot take is dropped
    s.cache.token_to_kv_pool_allocator.free(hog)
    assert s.avail == POOL


def test_swap_out_declines_without_host_room_and_leaves_the_slot():
    s = make_stream(n=12, published=4)
    host = HostKVPool(10)
    before = s.avail

    assert host.swap_out(s.cache, SID, TOKENS) == 0

    assert SID not in host and s.cache.session.slots[SID] is s.slot and s.avail == before
    assert host.drop(SID) is None
    assert s.drain() == POOL


def test_a_copy_evicted_before_its_turn_comes_back_from_the_kept_host_copy():
    """Swapped in, the copy is evictable cache until its turn's admission locks it. LRU
    eviction before then takes it, and the host copy (kept) brings back exactly what was lost;
    dropped once the stream holds its slot again, it is returned for the caller's counters."""
    s = make_stream(n=12, published=0)
    k, v = fill_kv(s)
    host = HostKVPool(64)
    host.swap_out(s.cache, SID, TOKENS)
    assert host.swap_in(s.cache, SID) == SwapInResult(restored=12, reused=0, dropped=False)
    # nothing lost: a second swap-in copies nothing
    assert host.swap_in(s.cache, SID) == SwapInResult(0, 12, False, again=True)
    s.cache.evict(EvictParams(num_tokens=POOL))  # another admission's eviction
    assert tree_kv(s, TOKENS)[0] == 0 and s.avail == POOL

    assert host.swap_in(s.cache, SID) == SwapInResult(12, 0, False, again=True)

    matched, k_tree, v_tree = tree_kv(s, TOKENS)
    assert matched == 12 and torch.equal(k_tree, k) and torch.equal(v_tree, v)
    entry = host.drop(SID)
    assert entry is not None and entry.restored and entry.size == 12 and SID not in host
    s.cache.evict(EvictParams(num_tokens=POOL))
    assert s.avail == POOL


def test_a_salted_streams_copy_goes_back_under_its_own_namespace():
    """A stream whose turns carry a `cache_salt` (a tenant's cache namespace) is swapped out
    and its published prefix evicted: the copy goes back under that salt, where its next turn
    (salted) matches it, and not under the plain key, where another tenant's request would."""
    s = make_stream(n=12, published=0)
    k, v = fill_kv(s)
    host = HostKVPool(64)
    assert host.swap_out(s.cache, SID, TOKENS, cache_salt="tenant-a") == 12

    assert host.swap_in(s.cache, SID) == SwapInResult(restored=12, reused=0, dropped=False)

    assert tree_kv(s, TOKENS)[0] == 0  # the shared namespace has none of it
    matched, k_tree, v_tree = tree_kv(s, TOKENS, salt="tenant-a")
    assert matched == 12 and torch.equal(k_tree, k) and torch.equal(v_tree, v)
    s.cache.evict(EvictParams(num_tokens=POOL))
    assert s.avail == POOL
