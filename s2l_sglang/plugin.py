"""The SGLang general plugin (entry-point group `sglang.srt.plugins`, name `stream2llm`).

This module is the ONE place where stream2llm-sglang changes SGLang's behaviour. SGLang calls
`register()` in every process it starts (engine, scheduler, detokenizer) before building its
components; each hook below is registered through SGLang's `HookRegistry`. When SGLang is
upgraded, the hook targets listed in `HOOKS` are the list to re-verify.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

logger = logging.getLogger(__name__)

_ROTARY_INIT = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.__init__"


def _cpu_without_sgl_kernel() -> bool:
    """True on a CPU-only host that runs SGLang's generic (non `SGLANG_USE_CPU_ENGINE`) path."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        return False
    import torch

    return not torch.cuda.is_available()


def _native_rotary_on_cpu(original: Callable, self, *args, **kwargs):
    """AROUND `RotaryEmbedding.__init__`: on a CPU host, take the native rotary path.

    Without `SGLANG_USE_CPU_ENGINE`, SGLang does not treat the host as a CPU, so the
    constructor falls back to `vllm._custom_ops.rotary_embedding`, a CUDA kernel that does
    not exist here. Declaring the host a CPU for the duration of the constructor selects
    `forward_native` (pure torch), which is what SGLang's own CPU path uses as a fallback.
    """
    import sglang.srt.layers.rotary_embedding.base as rotary_base

    saved = rotary_base._is_cpu
    rotary_base._is_cpu = True
    try:
        return original(self, *args, **kwargs)
    finally:
        rotary_base._is_cpu = saved


_SCHEDULER_DISPATCHER = "sglang.srt.managers.scheduler.Scheduler.init_request_dispatcher"
_SESSION_CREATE_REQ = "sglang.srt.session.session_controller.Session.create_req"

_scheduler = None  # the scheduler of this process (set when it builds its dispatcher)


def current_scheduler():
    """The SGLang `Scheduler` of this process (None outside a scheduler process)."""
    return _scheduler


def _set_policy(recv_req) -> None:
    """Scheduler handler of `SetStreamPolicyReq` (an unknown name is logged and ignored)."""
    try:
        stream_scheduling().set_policy(recv_req.policy)
        logger.info("stream policy set to %s", recv_req.policy)
    except ValueError:
        logger.exception("stream policy not changed")


def _set_publish(recv_req) -> None:
    """Scheduler handler of `SetPublishAtCloseReq`."""
    try:
        stream_scheduling().set_publish_at_close(bool(recv_req.on))
        logger.info("publish_at_close set to %s", bool(recv_req.on))
    except Exception:  # never take the scheduler down: the setting stays as it was
        _hook_failed("setting publish_at_close")


def _remember_scheduler(result, self, *args, **kwargs):
    """AFTER `Scheduler.init_request_dispatcher`: keep a handle on the scheduler, build its
    `StreamScheduling` from the config on its `ServerArgs`, and handle our messages."""
    global _scheduler, _stream_sched
    from s2l_sglang import adapter
    from s2l_sglang.config import of_server_args
    from s2l_sglang.messages import CancelStaleTurnReq, SetPublishAtCloseReq, SetStreamPolicyReq
    from s2l_sglang.scheduling import StreamScheduling

    _scheduler = self
    config = of_server_args(adapter.server_args(self))  # fails start-up if bad
    _stream_sched = StreamScheduling(config)
    adapter.add_handlers(
        self,
        [
            (SetStreamPolicyReq, _set_policy),
            (SetPublishAtCloseReq, _set_publish),
            (CancelStaleTurnReq, _cancel_stale_turn),
        ],
    )
    return result


def _cancel_stale_turn(recv_req) -> None:
    """Scheduler handler of `CancelStaleTurnReq`."""
    try:
        stream_scheduling().cancel_waiting_turn(_scheduler, recv_req.rid, recv_req.finishing)
    except Exception:  # never take the scheduler down
        _hook_failed(f"cancelling stale turn {recv_req.rid}")


def _hook_failed(what: str) -> None:
    """A scheduler-side hook failed: SGLang's own behaviour goes on; logged and counted
    (`hook_errors` in `s2l_sched`)."""
    logger.exception("%s failed; SGLang's own behaviour goes on", what)
    try:
        stream_scheduling().counters.hook_errors += 1
    except Exception:  # pragma: no cover - counting must not fail the fallback
        pass


def _stream_turn_create_req(original: Callable, self, req, tokenizer, *args, **kwargs):
    """AROUND `Session.create_req` for the turns of our streams (rids from `stream.rid`).

    1. A turn with `session_params.replace` rolls the streaming session back to
       `session_params.offset` tokens (update mode; radix_ext frees the stale KV), then goes on
       as a plain streaming append. SGLang's streaming sessions reject replace/offset.
    2. SGLang strips a leading BOS id from every appended session turn (turns are usually
       tokenized with special tokens); our turns carry exact token ids, so nothing is stripped.
    """
    from s2l_sglang import adapter
    from s2l_sglang.rid import stream_of

    if not (adapter.is_streaming(self) and stream_of(req.rid) is not None):
        return original(self, req, tokenizer, *args, **kwargs)
    try:
        stream_scheduling().on_turn(req.rid)
    except Exception:  # never take the scheduler down: the turn goes on unscheduled by us
        _hook_failed(f"recording stream turn {req.rid}")
    failure = None
    keep = adapter.take_replace(req)
    if keep is not None:
        try:
            adapter.rollback(self, _scheduler, keep)
        except Exception as exc:  # never take the scheduler down: abort this turn only
            _hook_failed(f"stream rollback of {req.rid}")
            failure = f"stream rollback failed: {exc}"
    new_req = original(self, req, None, *args, **kwargs)  # None: no BOS strip
    adapter.finish_turn_with_abort(new_req, tokenizer, failure)
    return new_req


_SESSION_CLOSE = "sglang.srt.session.session_controller.SessionController._close"


def _publish_closing_stream(original: Callable, self, session_id, *args, **kwargs):
    """AROUND `SessionController._close` (an immediate close, a deferred one once its turn has
    ended, a timeout): a stream's KV goes to the radix tree as cache before SGLang releases
    the session, as a finished plain request's does (`adapter.publish_at_close`)."""
    from s2l_sglang import adapter

    sched = stream_scheduling()
    if not sched.config.publish_at_close:
        return original(self, session_id, *args, **kwargs)
    try:
        result = adapter.publish_at_close(self, session_id)
        if result is not None and result.published:
            counters = sched.counters
            counters.streams_published += 1
            counters.tokens_published += result.published
            counters.tokens_published_adopted += result.adopted
    except Exception:  # never take the scheduler down: the close frees the KV as before
        _hook_failed(f"publishing the KV of closing session {session_id}")
    return original(self, session_id, *args, **kwargs)


_HTTP_LAUNCH = "sglang.srt.entrypoints.http_server.launch_server"
_CALC_PRIORITY = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"
_NEW_PREFILL = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"

_stream_sched = None


def stream_scheduling():
    """This scheduler process's `StreamScheduling` (policy, stream table, counters)."""
    global _stream_sched
    if _stream_sched is None:  # only before the scheduler's dispatcher exists (tests)
        from s2l_sglang.scheduling import StreamScheduling

        _stream_sched = StreamScheduling()
    return _stream_sched


def _order_by_stream_policy(original: Callable, self, waiting_queue, *args, **kwargs):
    """AROUND `SchedulePolicy.calc_priority`: SGLang's order, then the stream policy's."""
    from s2l_sglang import adapter

    result = original(self, waiting_queue, *args, **kwargs)
    if adapter.is_waiting_queue(_scheduler, waiting_queue):
        try:
            stream_scheduling().order_waiting(_scheduler)
        except Exception:  # never take the scheduler down: SGLang's order stands
            _hook_failed("stream policy ordering")
    return result


def _around_new_prefill(original: Callable, self, running_batch, *args, **kwargs):
    """AROUND `Scheduler.get_new_batch_prefill`: before it, preempt idle streams when the plan
    needs KV; during it, speculative turns that would eat into the reserve are held out of
    the waiting queue (at `calc_priority`), and put back after it; after it, account what
    the batch admitted ahead of committed work that waits."""
    sched = stream_scheduling()
    waiting = None
    try:
        sched.relieve_kv_pressure(self, running_batch)
        waiting = sched.before_admission(self)
    except Exception:  # never take the scheduler down
        _hook_failed("stream KV-pressure relief")
    sched.begin_admission()  # speculative turns may be held out of this admission
    try:
        batch = original(self, running_batch, *args, **kwargs)
    finally:
        try:
            sched.end_admission(self)
        except Exception:
            _hook_failed("returning held turns to the waiting queue")
    try:
        sched.after_prefill_step(self, batch, running_batch)
        if waiting is not None:
            sched.after_admission(batch, waiting)
    except Exception:
        _hook_failed("stream admission accounting")
    return batch


_HANDLE_GENERATE = "sglang.srt.managers.scheduler.Scheduler.handle_generate_request"
_NEXT_BATCH = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
_ABORT = "sglang.srt.managers.scheduler.Scheduler.abort_request"


def _park_final_turn(original: Callable, self, recv_req, *args, **kwargs):
    """AROUND `Scheduler.handle_generate_request`: a stream's final turn sent while its turn
    before is in flight (the manager's pipelined finish) is kept until that turn ends, then
    handed to SGLang, or sent back to be rebuilt (`StreamScheduling.park_final`)."""
    from s2l_sglang import adapter
    from s2l_sglang.scheduling import PARK, PASS

    verdict = PASS
    try:
        verdict = stream_scheduling().park_final(self, recv_req)
    except Exception:  # never take the scheduler down: SGLang takes the turn as it is
        _hook_failed(f"parking final turn {getattr(recv_req, 'rid', None)}")
    if verdict == PARK:
        return None
    result = original(self, recv_req, *args, **kwargs)
    if verdict != PASS:  # an abort message: the turn is aborted before it runs
        try:
            adapter.abort_waiting(self, recv_req.rid, verdict)
        except Exception:
            _hook_failed(f"sending final turn {recv_req.rid} back")
    return result


def _release_parked_finals(self, *args, **kwargs):
    """BEFORE `Scheduler.get_next_batch_to_run`: the parked final turns whose stream's turn
    before has ended go to SGLang now, in time for this step's batch (or are aborted)."""
    from s2l_sglang import adapter
    from s2l_sglang.scheduling import PASS

    try:
        released = stream_scheduling().release_parked(self)
    except Exception:
        _hook_failed("releasing parked final turns")
        return None
    for req, verdict in released:
        try:
            self.handle_generate_request(req)
            if verdict != PASS:
                adapter.abort_waiting(self, req.rid, verdict)
        except Exception:
            _hook_failed(f"releasing parked final turn {req.rid}")
        finally:
            stream_scheduling().handed_over(req.rid)
    return None


def _abort_parked_finals(original: Callable, self, recv_req, *args, **kwargs):
    """AROUND `Scheduler.abort_request`: a parked final turn it names is aborted as soon as
    its session's turn in flight has ended (`StreamScheduling.abort_parked`)."""
    try:
        stream_scheduling().abort_parked(recv_req)
    except Exception:
        _hook_failed("aborting parked final turns")
    return original(self, recv_req, *args, **kwargs)


_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"


def _export_sched_counters(result, self, *args, **kwargs):
    """AFTER `Scheduler.get_internal_state`: add the stream counters as `s2l_sched`."""
    from s2l_sglang import adapter

    try:
        stream_scheduling().configure(self)
        adapter.export_state(result, "s2l_sched", stream_scheduling().export(self))
    except Exception:  # never take the scheduler down
        _hook_failed("exporting stream counters")
    return result


def _install_stream_routes(*args, **kwargs):
    """BEFORE `http_server.launch_server`: add the /stream routes to SGLang's FastAPI app."""
    from sglang.srt.entrypoints import http_server

    from s2l_sglang.server.routes import install_routes

    install_routes(http_server.app)


def _stream_hooks() -> list[tuple[str, Callable, str]]:
    return [
        (_SCHEDULER_DISPATCHER, _remember_scheduler, "AFTER"),
        (_SESSION_CREATE_REQ, _stream_turn_create_req, "AROUND"),
        (_SESSION_CLOSE, _publish_closing_stream, "AROUND"),
        (_HTTP_LAUNCH, _install_stream_routes, "BEFORE"),
        (_CALC_PRIORITY, _order_by_stream_policy, "AROUND"),
        (_NEW_PREFILL, _around_new_prefill, "AROUND"),
        (_INTERNAL_STATE, _export_sched_counters, "AFTER"),
        (_HANDLE_GENERATE, _park_final_turn, "AROUND"),
        (_NEXT_BATCH, _release_parked_finals, "BEFORE"),
        (_ABORT, _abort_parked_finals, "AROUND"),
    ]


_TM_GENERATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"


def _stream_generate_request(original: Callable, self, obj, *args, **kwargs):
    """AROUND `TokenizerManager.generate_request`, one hook for three uses:
    0. a request that names a live stream's SGLang session is refused unless it is the stream
       manager's own turn (`stream/isolation.py`; SGLang's 400 for a ValueError);
    1. the request SGLang's OpenAI layer builds for a chat stream's finish
       (`POST /stream/v1/chat/completions`, its rid claimed there) becomes the stream's final
       turn (`server/chat.py`); that turn's own request comes back through this hook;
    2. on a PD prefill instance, a stream's turns are handled by `pd.hooks` (inert elsewhere).
    Every other request goes on unchanged."""
    from s2l_sglang.pd.hooks import stream_turns_on_prefill
    from s2l_sglang.server.chat import final_generate_request
    from s2l_sglang.stream import isolation

    try:
        isolation.check_generate(obj)
    except ValueError as exc:
        return _refused(exc)

    def not_a_chat_finish(tm, request, *a, **k):
        return stream_turns_on_prefill(original, tm, request, *a, **k)

    return final_generate_request(not_a_chat_finish, self, obj, *args, **kwargs)


async def _refused(exc: ValueError):
    """An async generator (what `generate_request` returns) that raises SGLang's 400."""
    raise exc
    yield  # pragma: no cover - makes this an async generator


_TM_CLOSE_SESSION = "sglang.srt.managers.tokenizer_manager.TokenizerManager.close_session"


async def _guard_close_session(original: Callable, self, obj, *args, **kwargs):
    """AROUND `TokenizerManager.close_session`: a live stream's session is closed only by the
    stream manager (`/close_session` gets SGLang's 400 otherwise; stream/isolation.py)."""
    from s2l_sglang.stream import isolation

    isolation.check_close(obj)
    return await original(self, obj, *args, **kwargs)


def _generate_request_hooks() -> list[tuple[str, Callable, str]]:
    return [
        (_TM_GENERATE, _stream_generate_request, "AROUND"),
        (_TM_CLOSE_SESSION, _guard_close_session, "AROUND"),
    ]


_SDPA_EXTEND = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend."
    "_run_sdpa_forward_extend"
)


def _extend_attention_over_new_tokens(
    original: Callable,
    self,
    query,
    output,
    k_cache,
    v_cache,
    req_to_token,
    req_pool_indices,
    seq_lens,
    extend_prefix_lens,
    extend_seq_lens,
    encoder_lens=None,
    scaling=None,
    enable_gqa=False,
    causal=False,
    is_cross_attn=False,
    sliding_window_size=None,
):
    """AROUND the torch-native backend's extend attention: queries of the new tokens only.

    SGLang's version pads each request's queries to the whole sequence (cached prefix
    included) and runs a square causal attention, so prefilling E new tokens after a cached
    prefix of P costs O((P+E)^2): a cached prefix saves almost nothing. Here the E queries attend
    to the P+E keys under an offset causal mask (query i sees keys j <= P+i): O(E*(P+E)), the
    same result. Cases other than plain causal self-attention go to SGLang's version.
    """
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    if (
        not causal
        or encoder_lens is not None
        or is_cross_attn
        or (sliding_window_size is not None and sliding_window_size > -1)
    ):
        return original(
            self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
            extend_prefix_lens, extend_seq_lens, encoder_lens, scaling=scaling,
            enable_gqa=enable_gqa, causal=causal, is_cross_attn=is_cross_attn,
            sliding_window_size=sliding_window_size,
        )  # fmt: skip
    heads_first = query.movedim(0, query.dim() - 2)  # [heads, tokens, dim]
    start = 0
    for i in range(seq_lens.shape[0]):
        new, cached, total = int(extend_seq_lens[i]), int(extend_prefix_lens[i]), int(seq_lens[i])
        q = heads_first[:, start : start + new, :]
        tokens = req_to_token[req_pool_indices[i], :total]
        k = k_cache[tokens].movedim(0, query.dim() - 2)
        v = v_cache[tokens].movedim(0, query.dim() - 2)
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        if cached == 0:
            mask, is_causal = None, True
        else:
            mask = torch.ones(new, total, dtype=torch.bool, device=q.device).tril(diagonal=cached)
            is_causal = False
        out = scaled_dot_product_attention(
            q.unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=mask,
            enable_gqa=enable_gqa,
            scale=scaling,
            is_causal=is_causal,
        )
        output[start : start + new] = out.squeeze(0).movedim(query.dim() - 2, 0)
        start += new
    return output


def _cpu_hooks() -> list[tuple[str, Callable, str]]:
    return [
        (_ROTARY_INIT, _native_rotary_on_cpu, "AROUND"),
        (_SDPA_EXTEND, _extend_attention_over_new_tokens, "AROUND"),
    ]


def hooks() -> list[tuple[str, Callable, str]]:
    """Every hook this plugin installs: (target, function, hook type name)."""
    from s2l_sglang import pd

    found = _stream_hooks() + pd.stream_hooks() + _generate_request_hooks()
    if _cpu_without_sgl_kernel():
        found += _cpu_hooks() + pd.cpu_hooks()
    return found


def register() -> None:
    """Entry point called by SGLang's `load_plugins()` in each of its processes."""
    from sglang.srt.managers.io_struct import hook_custom_types
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from s2l_sglang.messages import CancelStaleTurnReq, SetPublishAtCloseReq, SetStreamPolicyReq

    hook_custom_types(SetStreamPolicyReq)
    hook_custom_types(SetPublishAtCloseReq)
    hook_custom_types(CancelStaleTurnReq)
    for target, fn, kind in hooks():
        HookRegistry.register(target, fn, HookType[kind])
    logger.info("stream2llm plugin registered %d hooks", len(hooks()))
