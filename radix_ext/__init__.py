"""RadixAttention extension: update-mode invalidation after the longest common prefix.

SGLang's prefix cache has no API to drop a suffix that a refined context no longer needs; a
changed suffix would linger as LRU garbage. `rollback_streaming_session` rolls a streaming
session's KV back to a kept prefix and frees the stale suffix at once (or, where the suffix was
published to the shared radix tree, drops only the stream's hold on it).
"""

from radix_ext.rollback import RollbackResult, page_floor, rollback_streaming_session

__all__ = ["RollbackResult", "page_floor", "rollback_streaming_session"]
