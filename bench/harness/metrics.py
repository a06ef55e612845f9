"""Metrics over query records: percentiles (failures count as +inf), CCDF, per-run summaries.

A failed query (error or timeout) never got its first token, so its TTFT is +inf: it stays in
the denominator of every percentile and of the CCDF, and a run with failures cannot look better
than one without.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from bench.harness.record import QueryRecord
from bench.harness.stats import enough

QUANTILES = (50, 95, 99)
KEYS = tuple(f"p{q}" for q in QUANTILES)
FAULT_RATIO = 0.95


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (linear interpolation, numpy's default), +inf values allowed.

    NaN if there are no values. Interpolating towards an infinite neighbour gives +inf.
    """
    x = np.sort(np.asarray(list(values), dtype=float))
    if x.size == 0:
        return float("nan")
    rank = q / 100.0 * (x.size - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    frac = rank - lo
    if math.isinf(x[lo]) or (frac > 0 and math.isinf(x[hi])):
        return float("inf")
    return float(x[lo] + (x[hi] - x[lo]) * frac)


def percentiles(
    values: Iterable[float], qs: Sequence[float] = QUANTILES
) -> dict[str, float | None]:
    """{"p50": ..., "p95": ..., "p99": ...}; None where there are too few values for it."""
    vals = list(values)
    return {f"p{q:g}": percentile(vals, q) if enough(f"p{q:g}", len(vals)) else None for q in qs}


def bound_ratios(
    records: Sequence[QueryRecord], bounds: Mapping[str, float]
) -> tuple[list[float], list[str]]:
    """(TTFT / bound of each query with a bound, ids of the measurement faults).

    A fault is a TTFT under FAULT_RATIO x its bound: the bound did not bound it, so one of
    the two measurements is wrong; faults are left out of the ratios."""
    ratios, faults = [], []
    for r in records:
        bound = bounds.get(r.query, 0.0)
        if not bound or not math.isfinite(bound):
            continue
        ratio = r.ttft / bound
        if ratio < FAULT_RATIO:
            faults.append(r.query)
        else:
            ratios.append(ratio)
    return ratios, faults


def ccdf(values: Iterable[float]) -> tuple[np.ndarray, np.ndarray]:
    """(x, P(X >= x)) at each finite value, sorted; +inf values keep the tail above zero."""
    x = np.sort(np.asarray(list(values), dtype=float))
    n = x.size
    if n == 0:
        return np.zeros(0), np.zeros(0)
    y = (n - np.arange(n)) / n
    finite = np.isfinite(x)
    return x[finite], y[finite]


def _finite_mean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if math.isfinite(v)]
    return float(np.mean(vals)) if vals else None


def summarize(records: Sequence[QueryRecord], bounds: Mapping[str, float] | None = None) -> dict:
    """One run's summary: TTFT and e2e percentiles, TTFT over the lower bound, completion time,
    throughput and token counts."""
    n = len(records)
    ok = [r for r in records if r.ok]
    ttft = [r.ttft for r in records]
    summary: dict = {
        "queries": n,
        "failed": n - len(ok),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "ttft_s": {**percentiles(ttft), "mean": _finite_mean(ttft), "n": n},
        "e2e_s": {**percentiles(r.e2e for r in records), "mean": _finite_mean([r.e2e for r in ok])},
    }
    if bounds:
        ratios, faults = bound_ratios(records, bounds)
        summary["ttft_over_bound"] = {**percentiles(ratios), "n": len(ratios)}
        summary["bound_faults"] = faults
    if n and len(ok) == n and all(r.done_at is not None for r in records):
        completion = max(r.done_at for r in records) - min(r.start for r in records)
    else:
        completion = float("inf")
    summary["completion_s"] = completion
    summary["throughput_qps"] = n / completion if completion > 0 else None
    summary["tokens"] = {
        "prompt": sum(r.prompt_tokens for r in ok),
        "prefilled": sum(r.prefilled for r in records),
        "reused": sum(r.reused for r in records),
        "invalidated": sum(r.invalidated for r in records),
        "unprefilled_at_finish_mean": _finite_mean(
            [float(r.unprefilled_at_finish) for r in ok if r.unprefilled_at_finish is not None]
        ),
    }
    summary["requests"] = sum(r.requests for r in records)
    return summary


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when undefined (missing, zero or both infinite)."""
    if a is None or b is None or b == 0 or (math.isinf(a) and math.isinf(b)):
        return None
    if math.isnan(a) or math.isnan(b):
        return None
    return a / b


def versus(summary: dict, baseline: dict) -> dict:
    """How a run compares with the baseline run (non-streaming) of the same workload and rate.

    `ttft_speedup`: baseline TTFT / this TTFT per percentile (>1: faster than the baseline);
    `completion_ratio`: this completion time / the baseline's (1.02: 2% slower).
    """
    return {
        "ttft_speedup": {k: ratio(baseline["ttft_s"][k], summary["ttft_s"][k]) for k in KEYS},
        "completion_ratio": ratio(summary["completion_s"], baseline["completion_s"]),
    }


def sorted_runs(runs: list[dict]) -> list[dict]:
    """Runs by workload (first-seen order), rate, mode (`MODE_ORDER`, then first-seen order)
    and repeat: the interleaving undone."""
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    modes = sorted(dict.fromkeys(r["mode"] for r in runs), key=mode_rank)
    return sorted(
        runs,
        key=lambda r: (
            workloads.index(r["workload"]),
            r["rate"],
            modes.index(r["mode"]),
            r.get("repeat", 0),
        ),
    )


MODE_ORDER = ("wait", "warming", "sessions", "stream")


def mode_rank(label: str) -> int:
    """Where a mode label sorts: wait, warming, sessions, stream-*, then others."""
    base = label.split("-")[0]
    return MODE_ORDER.index(base) if base in MODE_ORDER else len(MODE_ORDER)


def groups(runs: list[dict]) -> dict[tuple[str, float], list[dict]]:
    out: dict[tuple[str, float], list[dict]] = {}
    for run in sorted_runs(runs):
        out.setdefault((run["workload"], run["rate"]), []).append(run)
    return out
