"""The plugin's hooks for SGLang's prefill-decode (PD) mode (listed in `s2l_sglang/plugin.py`).

Two CPU fixes for SGLang's PD path without a CUDA driver (`cpu_hooks`), and the hooks that let a
stream live on a prefill instance (`stream_hooks`): its prefill-only turns stay there (no KV
hand-off), and its final turn, sent through the router, is the PD request whose KV goes to the
decode instance. How it fits together: docs/pd.md.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable

logger = logging.getLogger(__name__)

_RETRACTION_BACKUP = "sglang.srt.mem_cache.kv_cache_builder.resolve_decode_retraction_backup"
_MOONCAKE_SENDER_INIT = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__"
_PREFILL_PROCESS_REQ = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue._process_req"


def _cpu_tensor_retraction_backup(original: Callable, *args, **kwargs):
    """AROUND `resolve_decode_retraction_backup` on a CPU host: back retractions with CPU tensors.

    SGLang's default for a decode instance is a pinned host pool (`host_pool`), whose set-up
    calls `torch.cuda.cudart()` and fails without a CUDA driver; `cpu_tensor` is SGLang's other
    backend (what `--disaggregation-decode-retraction-backup cpu_tensor` selects).
    """
    from sglang.srt.runtime_context import get_context, get_disagg

    if get_disagg().disaggregation_decode_retraction_backup is None:
        get_context().override("s2l.pd.cpu", disaggregation_decode_retraction_backup="cpu_tensor")
    return original(*args, **kwargs)


def _no_host_tensor_indices(result, self, *args, **kwargs):
    """AFTER `MooncakeKVSender.__init__` on a CPU host: page indices computed in place.

    With `supports_host_tensor_indices`, the prefill scheduler copies the page indices into
    pinned memory and records a `torch.cuda.Event` for the transfer thread to wait on; neither
    exists without CUDA. Off, it takes SGLang's synchronous path (`kv_to_page_indices`).
    """
    self.supports_host_tensor_indices = False
    return result


def cpu_hooks() -> list[tuple[str, Callable, str]]:
    """The PD CPU fixes (installed on a CPU host only)."""
    return [
        (_RETRACTION_BACKUP, _cpu_tensor_retraction_backup, "AROUND"),
        (_MOONCAKE_SENDER_INIT, _no_host_tensor_indices, "AFTER"),
    ]


def stream_turns_on_prefill(original: Callable, self, obj, *args, **kwargs):
    """Inside the plugin's one AROUND hook on `TokenizerManager.generate_request` (plugin.py),
    on a PD prefill instance: stream turns.

    - the router's copy of a stream's final turn (rid `<sid>::s2l-final`, posted by this
      process's stream manager) becomes that stream's session turn (`RouterFinal.claim`);
    - a prefill-only turn stays on this instance: SGLang's fake bootstrap host (the one its
      warm-up and health checks use) gives it a sender that transfers nothing.
    Any other request, and every request on a server not in prefill mode, is untouched.
    """
    from s2l_sglang.rid import stream_of

    rid = getattr(obj, "rid", None)
    if (
        self.server_args.disaggregation_mode != "prefill"
        or not isinstance(rid, str)
        or stream_of(rid) is None
    ):
        return original(self, obj, *args, **kwargs)
    from s2l_sglang.pd import final as pd_final

    router = pd_final.active()
    pending = router.claim(obj) if router is not None else None
    if pending is not None:
        return pd_final.RouterFinal.watch(pending, original(self, obj, *args, **kwargs))
    if obj.bootstrap_host is None:
        from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

        obj.bootstrap_host = FAKE_BOOTSTRAP_HOST
        obj.bootstrap_room = zlib.crc32(rid.encode())
    return original(self, obj, *args, **kwargs)


def _keep_prefill_only(original: Callable, self, req):
    """AROUND `PrefillBootstrapQueue._process_req`: a stream's prefill-only turn stays one.

    SGLang sets every prefill-mode request's `max_new_tokens` to 1; a streaming session then
    carries the sampled token into its next turn's prompt. A turn sent with 0 keeps 0, so the
    session holds exactly the stream's tokens.
    """
    from s2l_sglang.rid import stream_of

    prefill_only = req.sampling_params.max_new_tokens == 0 and stream_of(req.rid) is not None
    result = original(self, req)
    if prefill_only:
        req.sampling_params.max_new_tokens = 0
    return result


def stream_hooks() -> list[tuple[str, Callable, str]]:
    """Streams on a prefill instance (inert on other servers). `stream_turns_on_prefill` runs
    inside the plugin's hook on `TokenizerManager.generate_request`, which it shares with chat
    streams (one hook per target)."""
    return [(_PREFILL_PROCESS_REQ, _keep_prefill_only, "AROUND")]
