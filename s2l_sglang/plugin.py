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


def _remember_scheduler(result, self, *args, **kwargs):
    """AFTER `Scheduler.init_request_dispatcher`: keep a handle on the scheduler."""
    global _scheduler
    _scheduler = self
    return result


def _stream_turn_create_req(original: Callable, self, req, tokenizer, *args, **kwargs):
    """AROUND `Session.create_req` for the turns of our streams (rids from `stream.rid`).

    1. A turn with `session_params.replace` rolls the streaming session back to
       `session_params.offset` tokens (update mode; radix_ext frees the stale KV), then goes on
       as a plain streaming append. SGLang's streaming sessions reject replace/offset.
    2. SGLang strips a leading BOS id from every appended session turn (turns are usually
       tokenized with special tokens); our turns carry exact token ids, so nothing is stripped.
    """
    from s2l_sglang.stream.rid import stream_of

    if not (self.streaming and stream_of(req.rid) is not None):
        return original(self, req, tokenizer, *args, **kwargs)
    stream_scheduling().on_turn(req.rid)
    params = req.session_params
    failure = None
    if params is not None and params.replace:
        from sglang.srt.managers.io_struct import SessionParams

        from radix_ext import rollback_streaming_session

        try:
            rollback_streaming_session(self, _scheduler.tree_cache, params.offset or 0)
        except Exception as exc:  # never take the scheduler down: abort this turn only
            logger.exception("stream rollback failed for %s", req.rid)
            failure = f"stream rollback failed: {exc}"
        req.session_params = SessionParams(id=params.id)
    new_req = original(self, req, None, *args, **kwargs)  # None: no BOS strip
    new_req.tokenizer = tokenizer
    if failure is not None and new_req.to_finish is None:
        new_req.set_finish_with_abort(failure)
    return new_req


_HTTP_LAUNCH = "sglang.srt.entrypoints.http_server.launch_server"
_CALC_PRIORITY = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"
_NEW_PREFILL = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"

_stream_sched = None


def stream_scheduling():
    """This scheduler process's `StreamScheduling` (policy, stream table, counters)."""
    global _stream_sched
    if _stream_sched is None:
        from s2l_sglang.sched.engine_hooks import StreamScheduling

        _stream_sched = StreamScheduling()
    return _stream_sched


def _order_by_stream_policy(original: Callable, self, waiting_queue, *args, **kwargs):
    """AROUND `SchedulePolicy.calc_priority`: SGLang's order, then the stream policy's."""
    result = original(self, waiting_queue, *args, **kwargs)
    if _scheduler is not None and waiting_queue is _scheduler.waiting_queue:
        stream_scheduling().order_waiting(_scheduler)
    return result


def _relieve_kv_pressure(self, *args, **kwargs):
    """BEFORE `Scheduler.get_new_batch_prefill`: preempt idle streams when the plan needs KV."""
    try:
        stream_scheduling().relieve_kv_pressure(self)
    except Exception:  # never take the scheduler down
        logger.exception("stream KV-pressure relief failed")


def _install_stream_routes(*args, **kwargs):
    """BEFORE `http_server.launch_server`: add the /stream routes to SGLang's FastAPI app."""
    from sglang.srt.entrypoints import http_server

    from s2l_sglang.server.routes import install_routes

    install_routes(http_server.app)


def _stream_hooks() -> list[tuple[str, Callable, str]]:
    return [
        (_SCHEDULER_DISPATCHER, _remember_scheduler, "AFTER"),
        (_SESSION_CREATE_REQ, _stream_turn_create_req, "AROUND"),
        (_HTTP_LAUNCH, _install_stream_routes, "BEFORE"),
        (_CALC_PRIORITY, _order_by_stream_policy, "AROUND"),
        (_NEW_PREFILL, _relieve_kv_pressure, "BEFORE"),
    ]


def _cpu_hooks() -> list[tuple[str, Callable, str]]:
    return [(_ROTARY_INIT, _native_rotary_on_cpu, "AROUND")]


def hooks() -> list[tuple[str, Callable, str]]:
    """Every hook this plugin installs: (target, function, hook type name)."""
    found = _stream_hooks()
    if _cpu_without_sgl_kernel():
        found += _cpu_hooks()
    return found


def register() -> None:
    """Entry point called by SGLang's `load_plugins()` in each of its processes."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn, kind in hooks():
        HookRegistry.register(target, fn, HookType[kind])
    logger.info("stream2llm plugin registered %d hooks", len(hooks()))
