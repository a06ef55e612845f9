"""Our IPC message to SGLang's scheduler: switch the stream policy at run time.

`SetStreamPolicyReq` is a msgspec struct of SGLang's request family (`BaseReq`). The plugin adds
it to SGLang's IPC decoder (`io_struct.hook_custom_types`, in every process) and to the
scheduler's request dispatcher; `StreamManager.set_policy` sends it over the tokenizer manager's
own socket to the scheduler. There is no reply: the new policy shows in the scheduler's
`s2l_sched` state. (Importing this module imports SGLang's io_struct.)
"""

from __future__ import annotations

from sglang.srt.managers.io_struct import BaseReq


class SetStreamPolicyReq(BaseReq, kw_only=True):
    policy: str
