"""Typed handoff objects of the plan step: request snapshots in, a plan out.

The scheduler integration builds one `ReqView` per live request each step; the plan step reads
nothing else. They are immutable NamedTuples rather than frozen dataclasses: building one costs
~0.3 us against ~1.5 us for a frozen slotted dataclass, which at 500 requests a step would be
several times the whole plan step. A view of an unchanged request may be reused across steps.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

ReqState = Literal["waiting", "running", "idle"]


class ReqView(NamedTuple):
    """One request (plain or stream) as the planner sees it, in tokens.

    Invariants the integrator keeps (not checked, for speed):
      - `held` >= 0: tokens whose KV the request holds now (on device).
      - `pending` >= 0: tokens arrived but not yet prefilled, i.e. what it would prefill now.
        0 for an idle partial stream with nothing new and for a decoding request.
      - `decoding`: already generating; needs exactly 1 token of budget and 1 KV slot per step
        (`pending` must then be 0).
      - `complete`: the context is final. A plain (non-stream) request is always complete.
      - `last_chunk`: arrival time of the latest chunk; for a plain request, `arrival`.
      - `state`: "idle" exactly when it has no work (not decoding, nothing pending); else
        "running" if it holds KV, "waiting" if not. Informational: the planner does not read it.
      - 0 <= `reclaimable_kv` <= `held`: KV tokens that preempting it would free (the tokens it
        holds privately; a prefix shared with other requests is not freed by one preemption).
        Reclaimable means freed by preempting this request; SGLang's `evictable_size()` is
        another quantity: prefix-cache KV no request holds, evictable by LRU.
      - `rid`s are unique within one snapshot.
    Timestamps are seconds on any clock, as long as all views of one step share it.
    """

    rid: str
    is_stream: bool
    complete: bool
    arrival: float
    last_chunk: float
    held: int
    pending: int
    state: ReqState
    decoding: bool
    reclaimable_kv: int

    @property
    def has_work(self) -> bool:
        """It can use tokens this step: a decode step, or something to prefill."""
        return self.decoding or self.pending > 0


class Grant(NamedTuple):
    """`tokens` (> 0) tokens for request `rid` this step; each needs one KV slot."""

    rid: str
    tokens: int


class Plan(NamedTuple):
    """What one scheduling step decided; allocates nothing (see planner.py for invariants).

    - `grants`: in priority order. A decoding request gets exactly 1 token, a prefill
      1..pending tokens; at most one prefill grant is truncated (chunked), the last one.
    - `order`: every rid of the snapshot, highest priority first (the policy's order).
    - `victims`: the requests not granted that hold reclaimable KV, in preemption order (never a
      granted request): first those with no work (idle partial streams), then the others,
      lowest priority first, with the ones the plan protects last.
    - `kv_needed`: KV slots the grants need (= sum of granted tokens).
    - `kv_shortfall`: max(0, kv_needed - free_kv): KV tokens to free by preempting victims, in
      `victims` order, before the grants can be allocated. Always coverable by the victims.
    """

    grants: tuple[Grant, ...]
    order: tuple[str, ...]
    victims: tuple[str, ...]
    kv_needed: int
    kv_shortfall: int

    @property
    def granted(self) -> dict[str, int]:
        """rid -> granted tokens."""
        return dict(self.grants)
