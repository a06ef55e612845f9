"""The order of a run's replays, and where its lower-bound samples go (pure functions).

A shared machine's speed drifts over a run, so the modes of one comparison are interleaved:

- every (workload, rate, mode, repeat) is one `Replay` of the same queries at the same arrival
  offsets; repeat r's replays form a block, shuffled with a seed (`interleave`), so each block
  holds every mode once and drift hits every mode alike;
- with run-time policy switching (`StreamEngine.set_stream_policy`, `POST /stream/policy`) all
  modes and policies run on one engine (`plan_single`); without it each policy needs its own
  engine start (`plan_per_policy`: the first engine runs the policy-free modes and its policy's
  `stream`, every other engine its own `stream` only) and the interleaving is per engine;
- the lower bound of each query is the minimum of `bound_repeats` samples taken on the same
  engine just before replays of its query set (`bound_slots`): the samples are spread over the
  workload's replays so that each query's samples come from different moments of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bench.harness.modes import Mode, get_mode, per_policy
from bench.harness.presets import Preset

NEUTRAL_POLICY = "default"  # SGLang's own order: the engine's policy for policy-free modes


@dataclass(frozen=True)
class Replay:
    """One replay of a workload's queries at one rate through one mode."""

    workload: str
    rate: float
    mode: Mode
    repeat: int = 0
    engine: int = 0  # which engine start (0 with policy switching)

    @property
    def policy(self) -> str:
        """The stream policy the engine must have for this replay."""
        return self.mode.policy if self.mode.uses_policy and self.mode.policy else NEUTRAL_POLICY

    @property
    def label(self) -> str:
        return self.mode.label


@dataclass(frozen=True)
class EnginePlan:
    """One engine start: the policy it starts with, its replays in run order."""

    policy: str
    replays: tuple[Replay, ...]


def _modes(preset: Preset, names: Sequence[str], trace_modes: dict[str, str], workload: str):
    """Mode instances for a workload: `stream` once per policy, modes that do not apply dropped."""
    out: list[Mode] = []
    for name in names:
        policies = (preset.policies or (NEUTRAL_POLICY,)) if per_policy(name) else (None,)
        for policy in policies:
            mode = get_mode(name, policy)
            if mode.applies_to(trace_modes.get(workload, "append")):
                out.append(mode)
    return out


def replays_of(
    preset: Preset, trace_modes: dict[str, str], modes: Sequence[str] | None = None
) -> list[Replay]:
    """Every replay of repeat 0 (unordered); `modes` restricts the mode names."""
    out = []
    for w in preset.workloads:
        names = [m for m in preset.workload_modes(w) if modes is None or m in modes]
        for rate in w.rates:
            for mode in _modes(preset, names, trace_modes, w.name):
                out.append(Replay(w.name, rate, mode))
    return out


def interleave(replays: Sequence[Replay], repeats: int, seed: int) -> list[Replay]:
    """`repeats` blocks of all `replays`, each block in its own seeded random order."""
    rng = np.random.default_rng([seed, 0x5EED])
    order = []
    for r in range(repeats):
        for i in rng.permutation(len(replays)):
            rp = replays[int(i)]
            order.append(Replay(rp.workload, rp.rate, rp.mode, r, rp.engine))
    return order


def plan_single(preset: Preset, trace_modes: dict[str, str]) -> list[EnginePlan]:
    """One engine for everything; the policy is switched before each replay."""
    order = interleave(replays_of(preset, trace_modes), preset.repeats, preset.seed)
    return [EnginePlan(order[0].policy if order else NEUTRAL_POLICY, tuple(order))]


def plan_per_policy(preset: Preset, trace_modes: dict[str, str]) -> list[EnginePlan]:
    """The fallback: one engine start per stream policy (the policy is fixed per process)."""
    policies = list(preset.policies) or [NEUTRAL_POLICY]
    named = (m for w in preset.workloads for m in preset.workload_modes(w))
    ours = list(dict.fromkeys(m for m in named if per_policy(m)))  # stream, stream-nopub
    if not ours:
        policies = policies[:1]
    plans = []
    for i, policy in enumerate(policies):
        one = replace(preset, policies=(policy,))
        names = None if i == 0 else ours
        replays = [
            Replay(r.workload, r.rate, r.mode, r.repeat, engine=i)
            for r in replays_of(one, trace_modes, names)
        ]
        order = interleave(replays, preset.repeats, preset.seed + i)
        plans.append(EnginePlan(policy, tuple(order)))
    return [p for p in plans if p.replays]


def bound_slots(n_queries: int, n_replays: int, samples: int = 3) -> list[list[list[int]]]:
    """Where the bound samples go: slot j (before a workload's j-th replay) holds passes, each
    a list of query indices to sample once (the cache is flushed before each pass).

    The `samples` x `n_queries` samples (pass 0 over all queries, then pass 1, ...) are cut into
    `n_replays` equal runs: with at least `samples` replays, each query's samples fall in
    different slots; with fewer, a slot holds several passes."""
    if n_replays <= 0 or n_queries <= 0:
        return [[] for _ in range(max(n_replays, 0))]
    total = samples * n_queries
    slots: list[list[tuple[int, list[int]]]] = [[] for _ in range(n_replays)]
    for k in range(total):
        passes, pass_index = slots[k * n_replays // total], k // n_queries
        if not passes or passes[-1][0] != pass_index:
            passes.append((pass_index, []))
        passes[-1][1].append(k % n_queries)
    return [[queries for _, queries in passes] for passes in slots]


def drift(probes: Sequence[float | None], margin: float) -> tuple[float | None, list[dict]]:
    """(the median probe, per probe {"deviation", "flagged"}): a probe that strays from the run's
    median by more than `margin` (0.25: 25%) marks its replay as measured on a different
    machine."""
    finite = [p for p in probes if p is not None and np.isfinite(p)]
    if not finite:
        return None, [{"deviation": None, "flagged": False} for _ in probes]
    median = float(np.median(finite))
    out = []
    for p in probes:
        if p is None or not np.isfinite(p):
            out.append({"deviation": None, "flagged": True})
            continue
        dev = p / median - 1.0
        out.append({"deviation": dev, "flagged": abs(dev) > margin})
    return median, out
