"""Publish a closing streaming session's KV to the radix tree, as a finished plain request's is.

SGLang keeps a finished plain request's prompt and output in the radix tree (LRU cache that a
later request with the same prefix reuses). A streaming session publishes only its first
turn's prompt (`StreamingSession.try_checkpoint`); when the session closes, `release_session`
frees the rest of its row, `[cache_protected_len, kv_allocated_len)`. A later request with the
same context (a duplicate query, an agent re-sending its context, a follow-up sent as a plain
request) then prefills it again where, after a plain request, it would hit the cache.

`publish_session_kv` runs just before that release. It inserts the row's committed tokens
`[0, N)` under their token ids, as `UnifiedRadixCache.checkpoint_into_tree` inserts a finished
request's: `[0, cache_protected_len)` are the tree's own indices already; of the rest, what the
tree already holds (another request published the same tokens) is freed as our duplicate, and
the tree adopts the remainder. The row is pointed at the tree's indices and the slot's tree lock
moved onto the inserted node, so the stock release that follows frees only what stays private
(past `N`) and unlocks the node, leaving the published KV evictable cache.

Page size 1 only (the CPU default), as swap: with larger pages nothing is published and the
close frees the row as before.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class PublishResult:
    published: int  # tokens of the row now in the tree past what the session had published
    adopted: int  # of those, tokens whose KV the tree took from the row (the rest it held)


NOTHING = PublishResult(0, 0)


def publish_session_kv(
    cache: Any,
    sid: str,
    tokens: list[int],
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
) -> PublishResult:
    """Insert session `sid`'s committed KV for `tokens` into `cache`'s radix tree.

    `cache` is the scheduler's `UnifiedRadixCache`; `tokens` are the ids whose KV the slot's row
    holds, in order (the session's last finished turn's prompt and output); `extra_key` and
    `cache_salt` are that turn's, so the key is the one a request of the same namespace matches.
    Must run between turns (no turn of the session in flight), right before the slot's release.
    """
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    slot = cache.session.slots.get(sid)
    if slot is None or not slot.kv.holds_kv or cache.page_size != 1 or cache.disable:
        return NOTHING
    kv = slot.kv
    n = min(kv.kv_committed_len, kv.kv_allocated_len, len(tokens))
    protected = kv.cache_protected_len
    if n <= protected:
        return NOTHING
    key = RadixKey(array("q", tokens[:n]), extra_key, cache_salt=cache_salt)
    value = cache.req_to_token_pool.req_to_token[kv.req_pool_idx, :n].to(torch.int64, copy=True)
    result = cache.insert(
        InsertParams(
            key=key, value=value, prev_prefix_len=protected, inserted_len=kv.cache_inserted_len
        )
    )
    if result.rotation_tail_declined:  # logical-page sharding only: the row stays private
        return NOTHING
    node = result.last_device_node
    indices = cache.path_device_indices(node)
    # The insert freed our duplicates of what the tree held in [protected, prefix_len): point
    # the row at the tree's indices, as checkpoint_into_tree does.
    cache.req_to_token_pool.write(
        (kv.req_pool_idx, slice(protected, len(indices))), indices[protected:]
    )
    old, slot.lock = slot.lock, cache.lock(node)
    cache.unlock(old)
    kv.cache_protected_len = len(indices)
    kv.cache_inserted_len = max(kv.cache_inserted_len, len(indices))
    held = max(int(result.prefix_len), protected)
    return PublishResult(len(indices) - protected, max(0, len(indices) - held))
