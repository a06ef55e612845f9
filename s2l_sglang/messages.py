"""Our IPC messages to SGLang's scheduler.

- `SetStreamPolicyReq`: switch the stream policy at run time (`StreamManager.set_policy`). There
  is no reply: the new policy shows in the scheduler's `s2l_sched` state.
- `SetPublishAtCloseReq`: switch `publish_at_close` at run time
  (`StreamManager.set_publish_at_close`); it shows in `s2l_sched` as the policy does.
- `CancelStaleTurnReq`: abort a stream's prefill turn that a newer context made stale, if it
  still waits in the queue without its session's KV (`StreamManager._cancel_if_superseded`);
  the turn then ends with an abort whose message is `CANCELLED`. A turn already running, or
  waiting on its session's KV, is left alone: aborting it would drop the session's KV slot.
  With `finishing` (sent at a finish, `StreamManager._promote_inflight`), such a turn is
  promoted instead: the scheduler takes the stream's context as final, so the turn ranks as
  committed work, and the final turn, which waits for it, is not held behind speculative work.

They are msgspec structs of SGLang's request family (`BaseReq`). The plugin adds them to
SGLang's IPC decoder (`io_struct.hook_custom_types`, in every process) and to the scheduler's
request dispatcher; the stream manager sends them over the tokenizer manager's own socket, after
the requests they refer to. (Importing this module imports SGLang's io_struct.)
"""

from __future__ import annotations

from sglang.srt.managers.io_struct import BaseReq

from s2l_sglang.rid import CANCELLED

__all__ = ["CANCELLED", "CancelStaleTurnReq", "SetPublishAtCloseReq", "SetStreamPolicyReq"]


class SetStreamPolicyReq(BaseReq, kw_only=True):
    policy: str


class SetPublishAtCloseReq(BaseReq, kw_only=True):
    on: bool


class CancelStaleTurnReq(BaseReq, kw_only=True):
    # the turn's rid is BaseReq's `rid`
    finishing: bool = False  # sent because the stream is finishing
