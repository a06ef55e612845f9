"""Preemption modes: how a victim's KV is given up (recompute or swap), chosen by name.

A mode decides per victim from that victim's own held tokens. `auto` asks a measured
`CostModel`; `recompute` and `swap` are fixed. Mode names feed CLI `choices`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from s2l_sglang.registry import Registry
from s2l_sglang.sched.costmodel import Choice, CostModel


class Preemption:
    """Decides how to preempt one victim."""

    name: ClassVar[str] = ""

    def __init__(self, cost_model: CostModel | None = None) -> None:
        self.cost_model = cost_model

    def decide(self, held_tokens: int, host_free_kv: int | None = None) -> Choice:
        """`held_tokens`: the victim's own KV tokens. `host_free_kv`: room in host memory for
        swapped KV, in tokens (None: unbounded); a swap that would not fit there recomputes."""
        raise NotImplementedError


_MODES: Registry[type[Preemption]] = Registry("preemption mode")


def register_preemption(name: str) -> Callable[[type[Preemption]], type[Preemption]]:
    """Class decorator: make a `Preemption` subclass selectable as `name`."""
    return _MODES.register(name)


def preemption_names() -> list[str]:
    return _MODES.names()


def get_preemption(name: str, cost_model: CostModel | None = None) -> Preemption:
    """A new instance of mode `name`; `auto` requires `cost_model`."""
    return _MODES.get(name)(cost_model)


def _swap_fits(held_tokens: int, host_free_kv: int | None) -> bool:
    return host_free_kv is None or held_tokens <= host_free_kv


@register_preemption("recompute")
class RecomputePreemption(Preemption):
    """Always free the KV; the victim prefills it again when resumed."""

    def decide(self, held_tokens: int, host_free_kv: int | None = None) -> Choice:
        return "recompute"


@register_preemption("swap")
class SwapPreemption(Preemption):
    """Copy the KV to host and back, unless host memory cannot hold it."""

    def decide(self, held_tokens: int, host_free_kv: int | None = None) -> Choice:
        return "swap" if _swap_fits(held_tokens, host_free_kv) else "recompute"


@register_preemption("auto")
class AutoPreemption(Preemption):
    """The cheaper of the two for this victim's held tokens, by the measured cost model."""

    def __init__(self, cost_model: CostModel | None = None) -> None:
        if cost_model is None:
            raise ValueError("preemption mode 'auto' needs a cost model (measure or load one)")
        super().__init__(cost_model)

    def decide(self, held_tokens: int, host_free_kv: int | None = None) -> Choice:
        assert self.cost_model is not None
        if not _swap_fits(held_tokens, host_free_kv):
            return "recompute"
        return self.cost_model.choose(held_tokens)
