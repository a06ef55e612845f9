"""From replays to comparisons: per-replay summaries, drift flags, and the pooled comparison of
each (workload, rate, mode) with `wait`, with bootstrap intervals.

Works on the run dicts of a result (`runs`, their `queries` as written to results.json), so a
saved result can be aggregated again (`bench.compare`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from bench.harness.metrics import FAULT_RATIO, KEYS, percentiles, summarize, versus
from bench.harness.record import QueryRecord
from bench.harness.schedule import drift
from bench.harness.stats import speedup_ci

BASELINE = "wait"
#: SGLang's own ways to use a context before it is final; each stream mode is also compared
#: with them (`vs_peers`)
PEERS = ("sessions", "warming")


def ttft_of(q: Mapping) -> float:
    """A query dict's TTFT; a failure (None or "inf") is +inf."""
    v = q.get("ttft")
    return float("inf") if v is None or v == "inf" else float(v)


def bounds_of(lower_bound: Mapping, engine: int, workload: str) -> dict[str, float]:
    """Per query, the minimum of its bound samples on `engine` (the bound of its TTFTs there)."""
    samples = (lower_bound.get("samples_s") or {}).get(str(engine), {}).get(workload, {})
    out = {}
    for qid, values in samples.items():
        finite = [float(v) for v in values if v not in (None, "inf") and math.isfinite(float(v))]
        if finite:
            out[qid] = min(finite)
    return out


def summarize_runs(runs: list[dict], lower_bound: Mapping, margin: float) -> None:
    """Give each run its `summary`, `vs_wait` (the `wait` replay of the same workload, rate and
    repeat), `drift` and `bound_faults`; records become `queries` dicts."""
    baselines = {}
    for run in runs:
        bounds = bounds_of(lower_bound, run.get("engine", 0), run["workload"])
        run["summary"] = summarize(run["records"], bounds or None)
        run["bound_faults"] = len(run["summary"].get("bound_faults", []))
        if run["mode"] == BASELINE:
            baselines[(run["workload"], run["rate"], run.get("repeat", 0))] = run["summary"]
    for run in runs:
        base = baselines.get((run["workload"], run["rate"], run.get("repeat", 0)))
        run["vs_wait"] = versus(run["summary"], base) if base is not None else None
        run["queries"] = [
            r.as_dict() if isinstance(r, QueryRecord) else r for r in run.pop("records")
        ]
    median, flags = drift([r.get("probe_s") for r in runs], margin)
    for run, flag in zip(runs, flags, strict=True):
        run["drift"] = {**flag, "median_s": median, "margin": margin}


def by_query(
    runs: Sequence[dict], chunks: Callable[[int], bool] | None = None
) -> dict[str, list[float]]:
    """Query id -> its TTFTs over the repeats of `runs`; `chunks`: only the queries whose
    number of context chunks it accepts."""
    out: dict[str, list[float]] = {}
    for run in sorted(runs, key=lambda r: r.get("repeat", 0)):
        for q in run["queries"]:
            if chunks is None or chunks(q.get("chunks", 0)):
                out.setdefault(q["query"], []).append(ttft_of(q))
    return out


def one_chunk(n: int) -> bool:
    """A context that came whole (`by_query`'s `chunks`)."""
    return n == 1


def comparisons(
    runs: list[dict],
    seed: int = 0,
    local_tok_s: float | None = None,
    lower_bound: Mapping | None = None,
) -> list[dict]:
    """One entry per (workload, rate, mode): TTFT percentiles pooled over its repeats, the
    speedup over `wait` per percentile with a 95% interval, TTFT / bound (faults left out),
    completion ratio (mean over repeats), token counts per replay, bound faults, drift-flagged
    replays and the server utilization (rate x mean prompt tokens / `local_tok_s`). A stream
    mode's entry also has `vs_peers`: its speedup over each of `PEERS` that ran beside it, per
    percentile with a 95% interval (the peer's TTFT / the stream mode's). Every mode but
    `wait` has `one_chunk`: its speedup over `wait` for the queries whose context came in one
    chunk (`queries` of them): they have no speculative work of their own, so streaming can
    only cost them (other streams' work, and the ranks the policy gives their final turns)."""
    groups: dict[tuple[str, float, str], list[dict]] = {}
    prompt: dict[str, list[int]] = {}
    for run in runs:
        groups.setdefault((run["workload"], run["rate"], run["mode"]), []).append(run)
        tokens = [q["prompt_tokens"] for q in run["queries"] if q.get("prompt_tokens")]
        prompt.setdefault(run["workload"], []).extend(tokens)
    out = []
    for (workload, rate, mode), group in groups.items():
        ttfts = by_query(group)
        pooled = [t for values in ttfts.values() for t in values]
        base_runs = groups.get((workload, rate, BASELINE))
        entry: dict = {
            "workload": workload,
            "trace_mode": group[0]["trace_mode"],
            "rate": rate,
            "mode": mode,
            "repeats": len(group),
            "queries": len(ttfts),
            "failed": sum(math.isinf(t) for t in pooled),
            "ttft_s": {**percentiles(pooled), "n": len(pooled)},
            "bound_faults": sum(r.get("bound_faults", 0) for r in group),
            "drift_flagged": sum(bool((r.get("drift") or {}).get("flagged")) for r in group),
            "probe_s": [r.get("probe_s") for r in group],
            "tokens_per_replay": _tokens(group),
            "preemptions": _preemptions(group),
        }
        if lower_bound:
            ratios = []
            for r in group:
                bounds = bounds_of(lower_bound, r.get("engine", 0), workload)
                ratios += [
                    ttft_of(q) / bounds[q["query"]] for q in r["queries"] if q["query"] in bounds
                ]
            ok = [x for x in ratios if x >= FAULT_RATIO]
            entry["ttft_over_bound"] = {**percentiles(ok), "n": len(ok)}
        if local_tok_s and prompt.get(workload):
            entry["utilization"] = rate * float(np.mean(prompt[workload])) / local_tok_s
        if base_runs is not None:
            base = by_query(base_runs)
            entry["speedup"] = {k: speedup_ci(base, ttfts, k, seed) for k in KEYS}
            ratios = [
                (r.get("vs_wait") or {}).get("completion_ratio")
                for r in group
                if r.get("vs_wait") is not None
            ]
            # a saved result holds an infinite ratio as "inf" (report.write_json)
            ratios = [float(x) for x in ratios if x is not None]
            ratios = [x for x in ratios if math.isfinite(x)]
            entry["completion_ratio"] = float(np.mean(ratios)) if ratios else None
            whole = by_query(group, one_chunk) if mode != BASELINE else {}
            if whole:
                base_whole = by_query(base_runs, one_chunk)
                entry["one_chunk"] = {
                    "queries": len(whole),
                    **{k: speedup_ci(base_whole, whole, k, seed) for k in KEYS},
                }
        peers = [p for p in PEERS if (workload, rate, p) in groups]
        if mode.startswith("stream") and peers:
            entry["vs_peers"] = {
                p: {k: speedup_ci(by_query(groups[(workload, rate, p)]), ttfts, k, seed)
                    for k in KEYS}
                for p in peers
            }  # fmt: skip
        out.append(entry)
    return out


def _tokens(group: Sequence[dict]) -> dict:
    """Mean over the replays of their token counts (prefilled, invalidated, left at finish)."""
    keys = ("prefilled", "invalidated", "unprefilled_at_finish_mean")
    out = {}
    for k in keys:
        vals = [r["summary"]["tokens"].get(k) for r in group]
        vals = [v for v in vals if v is not None]
        out[k] = float(np.mean(vals)) if vals else None
    return out


def _preemptions(group: Sequence[dict]) -> dict | None:
    scheds = [r.get("sched") for r in group]
    if not scheds or any(s is None for s in scheds):
        return None
    return {
        "recompute": sum(s.get("preemptions_recompute", 0) for s in scheds),
        "swap": sum(s.get("preemptions_swap", 0) for s in scheds),
    }
