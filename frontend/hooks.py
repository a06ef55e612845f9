"""The ONE place where the frontend package changes SGLang's frontend language (`sglang.lang`).

SGLang's interpreter dispatches IR nodes in `StreamExecutor._execute`, an isinstance chain with
no registry, so a new primitive needs an executor branch. Two AROUND hooks add it, registered
through SGLang's own `HookRegistry` (the mechanism `s2l_sglang/plugin.py` uses for the runtime):

    StreamExecutor._execute  SglStreamContext -> open/feed the stream (lang.execute_stream_context)
                             SglGen while a stream is open -> finish it (lang.execute_gen)
                             SglStreamClose -> abort a stream no gen finished
                             anything else -> SGLang's branch; if it raises, the stream is aborted
    StreamExecutor.end       queue SglStreamClose before the worker's stop sentinel

`install()` runs when the first `stream_context(...)` is built (idempotent). On an SGLang
upgrade, re-verify these two targets and the executor attributes lang.py reads (`text_`,
`variables`, `meta_info`, `variable_event`, `stream`, `stream_*_event`, `backend`, `use_thread`,
`queue`, `worker`, `num_api_spec_tokens`, `_resolve_sampling_params`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sglang.lang.ir import SglGen

from frontend import lang

_EXECUTE = "sglang.lang.interpreter.StreamExecutor._execute"
_END = "sglang.lang.interpreter.StreamExecutor.end"

_lock = threading.Lock()
_installed = False


def _execute(original: Callable, executor: Any, expr: Any) -> Any:
    """AROUND `StreamExecutor._execute`: the stream_context branches, then SGLang's chain."""
    if isinstance(expr, lang.SglStreamContext):
        return lang.execute_stream_context(executor, expr)
    if isinstance(expr, lang.SglStreamClose):
        return lang.close_stream(executor)
    if isinstance(expr, SglGen) and lang.has_stream(executor):
        return lang.execute_gen(executor, expr)
    try:
        return original(executor, expr)
    except BaseException:
        lang.close_stream(executor)  # the worker stops at an error: free the stream now
        raise


def _end(original: Callable, executor: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND `StreamExecutor.end`: a stream that no gen finished is aborted at the end."""
    if getattr(executor, "use_thread", False):
        if executor.worker.is_alive():
            executor.queue.put(lang.SglStreamClose())  # before the stop sentinel `end` queues
    else:
        lang.close_stream(executor)
    return original(executor, *args, **kwargs)


def hooks() -> list[tuple[str, Callable, str]]:
    """Every hook the frontend installs: (target, function, hook type name)."""
    return [(_EXECUTE, _execute, "AROUND"), (_END, _end, "AROUND")]


def install() -> None:
    """Register and apply the hooks (once per process)."""
    global _installed
    with _lock:
        if _installed:
            return
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for target, fn, kind in hooks():
            HookRegistry.register(target, fn, HookType[kind])
        HookRegistry.apply_hooks()
        _installed = True
