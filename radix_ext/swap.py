"""Swap a streaming session's KV to a host pool and back (preemption by swap).

Swap-out copies the session's committed KV (all layers, tokens `[0, N)`) with SGLang's own
retraction-backup primitive (`token_to_kv_pool_allocator.get_cpu_copy`) into host memory, then
releases the session slot exactly as recompute preemption does: the private tail is freed, the
published prefix stays in the radix tree as ordinary LRU cache.

Swap-in runs when the stream's next turn waits for admission: whatever prefix of the N tokens the
tree still holds is kept, the rest is allocated (evicting LRU cache if needed, with the matched
prefix locked), filled from the host copy (`load_cpu_copy`) and inserted into the tree. The turn's
own prefix match then finds all N tokens, as if the KV had never left. If the pool cannot take
them, the copy is dropped and the turn recomputes: slower, never wrong. The copy goes back under
the key it was computed under: the session's last turn's `extra_key` and `cache_salt` (a
tenant's cache namespace), as publication at close keys it (`radix_ext.publish`); under the
plain key a salted stream's KV would land in the shared namespace, where its own next turn
(salted) would not find it and another tenant's request would.

Back in the tree the copy is evictable cache until its turn's admission locks it. The host copy
is therefore kept (`SwappedKV.restored`) until the stream holds its slot again (the caller drops
it then): if LRU eviction takes part of the KV before the turn is admitted, a second swap-in
copies back only that part (`SwapInResult.again`) instead of the turn recomputing it.

On a CPU host "device" and "host" are both CPU memory: the same code path copies between the
engine's KV pool and separate host tensors. Page size 1 only (the CPU default); with larger
pages `swap_out` declines and the caller recomputes.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class SwappedKV:
    tokens: list[int]  # the token ids whose KV is held, in order
    kv_cpu: Any  # `get_cpu_copy` layout: per layer, chunks of [k, v]
    restored: bool = False  # swapped in at least once (kept until the stream holds its slot)
    extra_key: str | None = None  # the radix key's namespace the KV was computed under
    cache_salt: str | None = None

    @property
    def size(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, slots=True)
class SwapInResult:
    restored: int  # tokens copied back from host into the pool
    reused: int  # tokens the radix tree still held (no copy needed)
    dropped: bool  # True: the pool could not take them; the turn recomputes
    #: the copy had been swapped in before: `restored` is what the tree lost of it (LRU
    #: eviction) while its turn waited
    again: bool = False


class HostKVPool:
    """Swapped-out stream KV in host memory, bounded by `capacity_tokens`."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.entries: dict[str, SwappedKV] = {}

    @property
    def used_tokens(self) -> int:
        return sum(e.size for e in self.entries.values())

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.used_tokens

    def __contains__(self, sid: str) -> bool:
        return sid in self.entries

    def drop(self, sid: str) -> SwappedKV | None:
        """Forget `sid`'s copy; returns it (None: there was none)."""
        return self.entries.pop(sid, None)

    def swap_out(
        self,
        cache: Any,
        sid: str,
        tokens: list[int],
        *,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Copy session `sid`'s committed KV for `tokens` to host and release its slot;
        `extra_key` and `cache_salt`: the namespace of the session's last turn, the key the
        copy goes back under.

        Returns the tokens swapped out (0: nothing held, pages > 1, or no host room; the slot
        is then left alone and the caller may recompute instead).
        """
        slot = cache.session.slots.get(sid)
        if slot is None or not slot.kv.holds_kv or cache.page_size != 1:
            return 0
        n = min(slot.kv.kv_committed_len, len(tokens))
        # A stale copy of this stream (its turn was admitted without a swap-in) is replaced.
        if n <= 0 or n > self.free_tokens - (self.entries[sid].size if sid in self else 0):
            return 0
        indices = cache.req_to_token_pool.req_to_token[slot.kv.req_pool_idx, :n].to(torch.int64)
        kv_cpu = cache.token_to_kv_pool_allocator.get_cpu_copy(indices)
        self.entries[sid] = SwappedKV(list(tokens[:n]), kv_cpu, False, extra_key, cache_salt)
        cache.release_session(sid)
        return n

    def swap_in(self, cache: Any, sid: str) -> SwapInResult:
        """Put `sid`'s swapped KV back into the radix tree (see the module docstring). The
        host copy stays (marked `restored`) unless the pool cannot take it."""
        from sglang.srt.mem_cache.base_prefix_cache import (
            EvictParams,
            InsertParams,
            MatchPrefixParams,
        )
        from sglang.srt.mem_cache.radix_cache import RadixKey

        entry = self.entries[sid]
        again, entry.restored = entry.restored, True
        key = RadixKey(array("q", entry.tokens), entry.extra_key, cache_salt=entry.cache_salt)
        match = cache.match_prefix(MatchPrefixParams(key=key))
        reused = int(match.device_prefix_len)
        missing = entry.size - reused
        if missing <= 0:
            return SwapInResult(0, entry.size, False, again)
        lock = cache.lock(match.last_device_node)
        try:
            allocator = cache.token_to_kv_pool_allocator
            if allocator.available_size() < missing:
                cache.evict(EvictParams(num_tokens=missing - allocator.available_size()))
            new = allocator.alloc(missing) if allocator.available_size() >= missing else None
            if new is None:
                del self.entries[sid]
                return SwapInResult(0, reused, True, again)
            chunk = getattr(allocator.get_kvcache(), "cpu_offloading_chunk_size", 8192)
            allocator.load_cpu_copy(_slice(entry.kv_cpu, reused, entry.size, chunk), new)
            prefix = cache.path_device_indices(match.last_device_node)[:reused].to(torch.int64)
            value = torch.cat([prefix, new.to(torch.int64)])
            # The tree frees what it already holds past `prev_prefix_len` (our duplicates);
            # `[0, reused)` are its own indices.
            cache.insert(InsertParams(key=key, value=value, prev_prefix_len=reused))
        finally:
            cache.unlock(lock)
        return SwapInResult(missing, reused, False, again)


def _slice(kv_cpu: list, start: int, end: int, chunk: int) -> list:
    """Tokens `[start, end)` of a `get_cpu_copy` result, in its layout (chunks of `chunk`)."""
    out = []
    for chunks in kv_cpu:
        k = torch.cat([c[0] for c in chunks])[start:end]
        v = torch.cat([c[1] for c in chunks])[start:end]
        out.append([[k[i : i + chunk], v[i : i + chunk]] for i in range(0, end - start, chunk)])
    return out
