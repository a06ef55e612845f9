"""One query's measurements (`QueryRecord`) and the replay clock (`Timeline`).

Times in a record are seconds since the replay's start (`Timeline.t0`):

    start ........ chunk 0 ... chunk k ....... final chunk + question ... first token ... done
    |<------------------------- e2e ----------------------------------------------------->|
                                               final_at |<------ ttft ------>|

`final_at` is the final chunk's *scheduled* arrival, so a late client loop counts against the
system under test, never for it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any


class Timeline:
    """The replay clock: `now()` in seconds since `t0` (a `time.perf_counter()` value)."""

    def __init__(self, t0: float | None = None):
        self.t0 = time.perf_counter() if t0 is None else t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def until(self, t: float) -> None:
        """Sleep until `t` seconds after `t0` (at once if that time has passed)."""
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class QueryRecord:
    query: str
    workload: str
    trace_mode: str  # append | update
    mode: str  # the mode's label, e.g. "wait", "stream-fcfs"
    rate: float
    start: float  # the query's arrival (its Poisson offset)
    final_at: float  # the final chunk's scheduled arrival
    first_token_at: float | None = None
    done_at: float | None = None
    chunks: int = 0  # context chunks replayed
    requests: int = 0  # engine requests (turns) this query made
    prompt_tokens: int = 0  # of the request that generated
    prefilled: int = 0  # prompt tokens computed over all the query's requests
    reused: int = 0  # prompt tokens served from cached or held KV
    invalidated: int = 0  # held tokens dropped by rollbacks (our streams only)
    unprefilled_at_finish: int | None = None  # prompt tokens still to prefill at the final chunk
    output_tokens: int = 0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_token_at is not None

    @property
    def ttft(self) -> float:
        """Final chunk's arrival to the first output token (inf if it never came)."""
        return self.first_token_at - self.final_at if self.ok else float("inf")

    @property
    def e2e(self) -> float:
        """Query arrival (start of retrieval) to its last output token (inf if never done)."""
        return self.done_at - self.start if self.ok and self.done_at is not None else float("inf")

    def account(self, out: dict) -> None:
        """Add one finished engine request's token counts (SGLang's meta_info)."""
        meta = out.get("meta_info") or {}
        prompt, cached = int(meta.get("prompt_tokens", 0)), int(meta.get("cached_tokens", 0))
        self.requests += 1
        self.prefilled += prompt - cached
        self.reused += cached

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ttft"] = self.ttft if self.ok else None
        d["e2e"] = self.e2e if self.ok and self.done_at is not None else None
        return d


def has_token(out: dict) -> bool:
    """Whether an SGLang output carries a generated token."""
    if out.get("output_ids"):
        return True
    return int((out.get("meta_info") or {}).get("completion_tokens", 0) or 0) > 0
