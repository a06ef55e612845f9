"""RadixAttention extension: what SGLang's prefix cache lacks for streams.

- Update-mode invalidation after the longest common prefix. SGLang's prefix cache has no API to
  drop a suffix that a refined context no longer needs; a changed suffix would linger as LRU
  garbage. `rollback_streaming_session` rolls a streaming session's KV back to a kept prefix
  and frees the stale suffix at once (or, where the suffix was published to the shared radix
  tree, drops only the stream's hold on it).
- Publication at close. A streaming session publishes only its first turn's prompt and its
  close frees the rest; `publish_session_kv` hands the committed KV to the tree first, so a
  later request with the same context hits the cache as after a plain request.
- Swap (`radix_ext.swap`): a session's KV to a host pool and back.
"""

from radix_ext.publish import PublishResult, publish_session_kv
from radix_ext.rollback import RollbackResult, page_floor, rollback_streaming_session

__all__ = [
    "PublishResult",
    "RollbackResult",
    "page_floor",
    "publish_session_kv",
    "rollback_streaming_session",
]
