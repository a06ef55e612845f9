"""Run one engine's replays in their planned order (`schedule`), on one backend.

Before each replay: the stream policy it needs (switched at run time where the engine can), its
mode's `publish_at_close` (when a mode of the run sets one, `stream-nopub`), the speed probe,
then this replay's share of its workload's lower-bound samples (`bound_slots`), then a flush;
after it, the scheduler's counters. Each replay becomes a run dict (its raw
`records` until `aggregate.summarize_runs`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.harness.arrivals import arrival_seed, poisson_offsets
from bench.harness.backends import Backend
from bench.harness.presets import Preset
from bench.harness.queries import Query
from bench.harness.replay import lower_bound, replay, speed_probe
from bench.harness.schedule import EnginePlan, bound_slots
from s2l_sglang.scheduling import MAXIMA, SchedCounters


class Progress:
    """A tqdm bar on stderr (query replays and bound samples)."""

    def __init__(self, total: int, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="query", disable=not enabled, file=sys.stderr)

    def describe(self, text: str) -> None:
        self.bar.set_description(text, refresh=True)

    def tick(self, *_: Any) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


@dataclass
class RunContext:
    preset: Preset
    queries: dict[str, list[Query]]
    params: dict
    progress: Progress
    log: Callable[[str], None]
    switching: bool  # policies are switched on one engine
    #: the engine's `publish_at_close` as started, when a mode of the run switches it (None:
    #: never switched)
    publish: bool | None = None
    on_run: Callable[[dict], None] | None = None
    # engine -> workload -> query id -> bound samples (seconds)
    samples: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    order: int = 0  # replays done so far, all engines


def count_work(preset: Preset, plans: list[EnginePlan], queries: dict[str, list]) -> int:
    """Query replays and bound samples of the whole run: the progress total."""
    total = 0
    for plan in plans:
        for r in plan.replays:
            total += len(queries[r.workload])
        if preset.lower_bound:
            for w in {r.workload for r in plan.replays}:
                total += preset.bound_repeats * len(queries[w])
    return total


def _offsets(preset: Preset, workload: str, rate: float, n: int):
    return poisson_offsets(n, rate, arrival_seed(preset.seed, workload, rate))


def _bounds(backend: Backend, ctx: RunContext, engine: int, workload: str, passes) -> int:
    """Take one slot's bound samples; returns how many."""
    qs = ctx.queries[workload]
    store = ctx.samples.setdefault(str(engine), {}).setdefault(workload, {})
    taken = 0
    for indices in passes:
        if not backend.run(backend.flush()):
            ctx.log(f"warning: cache not flushed before {workload} bound samples")
        for i in indices:
            q = qs[i]
            try:
                value = backend.run(lower_bound(backend, q, ctx.params))
            except Exception as exc:
                ctx.log(f"warning: lower bound of {q.id} failed: {exc}")
                value = float("inf")
            store.setdefault(q.id, []).append(value)
            taken += 1
            ctx.progress.tick()
    return taken


def execute_plan(backend: Backend, plan: EnginePlan, engine: int, ctx: RunContext) -> list[dict]:
    """All replays of `plan` on `backend`, in order; returns their run dicts."""
    preset = ctx.preset
    per_workload = {w: [r for r in plan.replays if r.workload == w] for w in ctx.queries}
    slots = {
        w: bound_slots(len(ctx.queries[w]), len(rs), preset.bound_repeats)
        for w, rs in per_workload.items()
        if rs and preset.lower_bound
    }
    seen: dict[str, int] = {}
    policy: str | None = None if ctx.switching else plan.policy  # switched before the first
    runs = []
    for rp in plan.replays:
        qs = ctx.queries[rp.workload]
        if ctx.switching:  # also to the policy in force: it starts the maxima again
            backend.switch_policy(rp.policy)
            policy = rp.policy
        publish = ctx.publish if rp.mode.publish_at_close is None else rp.mode.publish_at_close
        if ctx.publish is not None:  # also back to the engine's own setting
            backend.switch_publish(publish)
        ctx.progress.describe(f"{rp.workload} {rp.rate:.3g} QPS {rp.label} #{rp.repeat}")
        probe = backend.run(speed_probe(backend, preset.probe_size))
        slot = seen.get(rp.workload, 0)
        seen[rp.workload] = slot + 1
        t_bound = time.perf_counter()
        taken = _bounds(backend, ctx, engine, rp.workload, slots[rp.workload][slot]) if (
            rp.workload in slots
        ) else 0  # fmt: skip
        bound_s = time.perf_counter() - t_bound
        flushed = backend.run(backend.flush())
        if not flushed:
            ctx.log(f"warning: cache not flushed before {rp.workload} {rp.rate:g} {rp.label}")
        offsets = _offsets(preset, rp.workload, rp.rate, len(qs))
        before = backend.run(backend.sched_counters())
        t0 = time.perf_counter()
        records = backend.run(
            replay(
                backend, rp.mode, qs, offsets, rp.rate, ctx.params, preset.drain_timeout_s,
                ctx.progress.tick,
            )
        )  # fmt: skip
        wall = time.perf_counter() - t0
        after = backend.run(backend.sched_counters())
        run = {
            "order": ctx.order,
            "workload": rp.workload,
            "trace_mode": qs[0].mode,
            "rate": rp.rate,
            "mode": rp.label,
            "policy": policy,
            "publish_at_close": publish,  # None: as the engine started (not switched)
            "repeat": rp.repeat,
            "engine": engine,
            "flushed_before": flushed,
            "probe_s": probe,
            "bound_samples": taken,
            "bound_s": bound_s,
            "replay_wall_s": wall,
            "offsets": [float(x) for x in offsets],
            "sched": replay_sched(before, after),
            # the maxima in `sched` are this replay's, or since the engine started
            "sched_maxima": "replay" if ctx.switching else "engine",
            "records": records,
        }
        ctx.order += 1
        runs.append(run)
        if ctx.on_run is not None:
            ctx.on_run(run)
    return runs


def replay_sched(before: dict | None, after: dict | None) -> dict | None:
    """The scheduler's numbers for one replay, from its `s2l_sched` export before and after:
    a count (a `SchedCounters` field that is not a maximum) as its increase; a maximum
    (`*_max`) and a state at one moment (`spec_reserve`, `host_kv_used`, `kv_available`, ...)
    as their value after the replay (a difference of either means nothing)."""
    if before is None or after is None:
        return None
    return {
        k: after[k] - before.get(k, 0) if k in _COUNTS else after[k]
        for k in after
        if isinstance(after[k], int | float) and not isinstance(after[k], bool)
    }


#: the `s2l_sched` keys that count events (what a replay adds to them is its own)
_COUNTS = frozenset(SchedCounters.__dataclass_fields__) - set(MAXIMA)
