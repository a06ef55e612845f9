"""How long a CPU preset takes, estimated before it runs (`s2l bench --estimate`).

    wall = engine start
         + per replay:  (queries - 1) / rate         the Poisson arrivals' span
                        + the slowest query's final-chunk time (x delays): a replay lasts
                          until its last query's context is collected, and with n queries
                          drawn that is about the trace set's 1 - 1/(n+1) quantile
                        + 2 x prefill of one query    its prefill and some queueing
                        + probe + 2 flushes
         + per bound sample: prefill of one query (x1.5 for update mode: the cached prefix is
                        the previous refined context, which the final one partly replaces)

The constants are measured on this project's 2-core CPU host with the embedded model in
bfloat16 (`CPU_MACHINE`). Checked against a quiet smoke run, `s2l bench --preset cpu-quick
--queries 2` (2026-12-01): 134 s measured against 170 s estimated (engine start 27 s; replays
of 7-12 s plus a 0.9 s probe against 13-15 s estimated, its two crawler queries collecting
faster than the mean; bound samples 1.0 s each against 1.0-1.4 s). The trace shapes are those
of the shipped sets (`SHAPES`: mean final-chunk time and prompt tokens, at a 1,000-token budget
and whole). It ignores a saturated engine (a mode that needs more prefill than the machine has
runs longer), so it is a floor for such runs. GPU presets are not estimated.

The slowest query's final-chunk time was the mean until 2026-12-01, when `paper-regime` (timeline
x86, 20 queries a workload) ran 95 minutes against 52 estimated: its replays lasted 25 and 18
minutes, as the quantile rule gives (crawler p95 14.5 s x 86 + arrivals 4 min; ANN 8.3 s x 86
+ 6 min). The quantiles (`TAIL`) are those of the whole shipped traces, as multiples of their
mean; at a 1,000-token budget the same multiples are applied to that budget's mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.harness.modes import per_policy
from bench.harness.presets import Preset, WorkloadSpec


@dataclass(frozen=True)
class Machine:
    engine_start_s: float = 30.0
    tok_s_short: float = 1100.0  # prefill tokens/s at <= 2,000 tokens
    tok_s_long: float = 630.0  # at 6,000 tokens
    overhead_s: float = 1.0  # per replay: flushes, counters, task start

    def prefill_tok_s(self, tokens: float) -> float:
        """Prefill rate for a prompt of `tokens` (per-token time linear from 2k to 6k tokens)."""
        if tokens <= 2000:
            return self.tok_s_short
        share = min(1.0, (tokens - 2000) / 4000)
        per_token = (1 - share) / self.tok_s_short + share / self.tok_s_long
        return 1.0 / per_token

    def prefill_s(self, tokens: float) -> float:
        return tokens / self.prefill_tok_s(tokens)


CPU_MACHINE = Machine()

# (workload, context budget) -> (traces, mean final-chunk time s, mean prompt tokens, trace mode)
SHAPES = {
    ("crawler", 1000): (175, 3.74, 1041, "append"),
    ("crawler", None): (175, 8.74, 5569, "append"),
    ("ann", 1000): (200, 4.46, 1047, "update"),
    ("ann", None): (200, 4.46, 5625, "update"),
}


# final-chunk time quantiles of the shipped traces (whole), as multiples of the mean:
# (p90, p95, max); crawler mean 8.74 s: 13.27 / 14.52 / 20.17 s; ANN mean 4.46 s: 6.85 / 8.31 /
# 14.24 s
TAIL = {"crawler": (1.52, 1.66, 2.31), "ann": (1.54, 1.86, 3.19)}


def slowest_final_s(workload: str, mean_s: float, queries: int) -> float:
    """About the largest final-chunk time among `queries` drawn traces."""
    p90, p95, top = TAIL.get(workload, (1.5, 1.7, 2.5))
    if queries >= 100:
        return mean_s * top
    if queries >= 20:
        return mean_s * p95
    if queries >= 10:
        return mean_s * p90
    return mean_s * (1 + (p90 - 1) * queries / 10)


def _shape(w: WorkloadSpec, budget: int | None) -> tuple[int, float, float, str]:
    if (w.name, budget) in SHAPES:
        return SHAPES[(w.name, budget)]
    n, final_t, tokens, mode = SHAPES.get((w.name, None), (100, 8.74, 5569, "append"))
    return n, final_t, min(tokens, budget or tokens), mode


def replay_modes(preset: Preset, w: WorkloadSpec, trace_mode: str) -> int:
    """Replays per rate and repeat: the modes that apply, `stream` once per policy."""
    count = 0
    for mode in preset.workload_modes(w):
        if mode == "sessions" and trace_mode == "update":
            continue
        count += len(preset.policies) if per_policy(mode) else 1
    return count


def estimate(preset: Preset, machine: Machine = CPU_MACHINE) -> dict | None:
    """Estimated seconds, in total and by part; None for a preset with its own model (GPU)."""
    if preset.model_path:
        return None
    probe_s = machine.prefill_s(preset.probe_size)
    replays_s = bounds_s = 0.0
    replays = 0
    for w in preset.workloads:
        traces, final_t, tokens, trace_mode = _shape(w, preset.max_context_tokens)
        n = min(w.queries or traces, traces)
        query_s = machine.prefill_s(tokens)
        delay = preset.delay_scale
        rates = list(w.rates)
        if preset.paper is not None:  # the run's own mapping, at this machine's rate
            local = machine.prefill_tok_s(tokens)
            delay = preset.paper.delay_scale(local)
            rates = [preset.paper.local_qps(w.name, q, local, tokens) for q in w.rates]
        per_rate = replay_modes(preset, w, trace_mode) * preset.repeats
        for rate in rates:
            span = (n - 1) / rate + slowest_final_s(w.name, final_t, n) * delay + 2 * query_s
            replays_s += per_rate * (span + probe_s + machine.overhead_s)
            replays += per_rate
        if preset.lower_bound:
            bounds_s += preset.bound_repeats * n * query_s * (1.5 if trace_mode == "update" else 1)
    total = machine.engine_start_s + replays_s + bounds_s
    return {"total_s": total, "replays": replays, "replays_s": replays_s, "bounds_s": bounds_s}
