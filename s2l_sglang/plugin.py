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


def _cpu_hooks() -> list[tuple[str, Callable, str]]:
    return [(_ROTARY_INIT, _native_rotary_on_cpu, "AROUND")]


def hooks() -> list[tuple[str, Callable, str]]:
    """Every hook this plugin installs: (target, function, hook type name)."""
    found: list[tuple[str, Callable, str]] = []
    if _cpu_without_sgl_kernel():
        found += _cpu_hooks()
    return found


def register() -> None:
    """Entry point called by SGLang's `load_plugins()` in each of its processes."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn, kind in hooks():
        HookRegistry.register(target, fn, HookType[kind])
    logger.info("stream2llm plugin registered %d hooks", len(hooks()))
