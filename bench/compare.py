"""Two runs of a preset side by side: how much do their speedups differ?

    .venv/bin/python -m bench.compare A/results.json B/results.json

Prints, per workload, rate, mode and percentile, run A's and run B's TTFT speedup over `wait`
(with their 95% intervals) and B / A, then one line with the range of B / A: the spread of the
same benchmark run twice. Rates are matched as the paper's QPS for paper-regime results (their
local rates depend on each run's measured prefill rate). A result without `comparisons` (an
older file) is aggregated from its runs; `--again` aggregates both anew with the current
harness (a result saved before the replay-level bootstrap gets today's intervals).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.harness.metrics import KEYS, mode_rank


def load(path: str | Path, again: bool = False) -> dict:
    """A result with its `comparisons`: those it holds, or (`again`, or an older file without
    them) aggregated from its runs by the current harness."""
    from bench.harness.report import read_json

    result = read_json(Path(path))
    if again or not result.get("comparisons"):
        from bench.harness.aggregate import comparisons

        result["comparisons"] = comparisons(result["runs"], result.get("config", {}).get("seed", 0))
    return result


def _rate_key(result: dict, workload: str, rate: float) -> float:
    cal = result.get("paper_regime") or {}
    for r in (cal.get("rates") or {}).get(workload, []):
        if math.isclose(r["local_qps"], rate, rel_tol=1e-9):
            return r["paper_qps"]
    return round(rate, 6)


def speedups(result: dict) -> dict[tuple[str, float, str, str], dict]:
    """(workload, rate key, mode, percentile) -> the speedup dict (value, lo, hi, n)."""
    out = {}
    for c in result["comparisons"]:
        if c["mode"] == "wait" or not c.get("speedup"):
            continue
        key = _rate_key(result, c["workload"], c["rate"])
        for k in KEYS:
            out[(c["workload"], key, c["mode"], k)] = c["speedup"].get(k) or {}
    return out


def _value(sp: dict | None) -> float | None:
    v = (sp or {}).get("value")
    if v is None:
        return None
    v = float("inf") if v == "inf" else float(v)
    return v if math.isfinite(v) else None


def rows(a: dict, b: dict) -> list[list[str]]:
    from bench.harness.report import fmt_speedup, fmt_x

    sa, sb = speedups(a), speedups(b)
    workloads = list(dict.fromkeys(k[0] for k in [*sa, *sb]))
    keys = sorted(
        set(sa) | set(sb),
        key=lambda k: (workloads.index(k[0]), k[1], mode_rank(k[2]), k[2], KEYS.index(k[3])),
    )
    out = []
    for key in keys:
        if all((sp.get(key) or {}).get("insufficient") for sp in (sa, sb)):
            continue  # too few samples in both runs (the closing line counts them)
        va, vb = _value(sa.get(key)), _value(sb.get(key))
        ratio = fmt_x(vb / va) if va and vb is not None else "-"
        out.append([key[0], f"{key[1]:g}", key[2], key[3], fmt_speedup(sa.get(key)),
                    fmt_speedup(sb.get(key)), ratio])  # fmt: skip
    return out


def too_few_in_both(a: dict, b: dict) -> int:
    sa, sb = speedups(a), speedups(b)
    return sum(
        1
        for k in set(sa) | set(sb)
        if all((sp.get(k) or {}).get("insufficient") for sp in (sa, sb))
    )


def spread(table: Sequence[Sequence[str]]) -> str:
    ratios = [float(r[-1].rstrip("x")) for r in table if r[-1] not in ("-", "inf")]
    if not ratios:
        return "no speedup in both runs"
    return (
        f"{len(ratios)} speedups in both runs; B / A from {min(ratios):.2f} to {max(ratios):.2f} "
        f"(median {float(np.median(ratios)):.2f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", type=Path, help="results.json of run A")
    parser.add_argument("b", type=Path, help="results.json of run B")
    parser.add_argument(
        "--again",
        action="store_true",
        help="aggregate both runs anew with the current harness (its intervals), not as saved",
    )
    args = parser.parse_args(argv)
    try:
        a, b = load(args.a, args.again), load(args.b, args.again)
    except (OSError, ValueError, KeyError) as exc:
        print(f"bench.compare: error: {exc}", file=sys.stderr)
        return 2
    header = ["workload", "QPS", "mode", "pct", f"A ({a['date']})", f"B ({b['date']})", "B / A"]
    table = rows(a, b)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table, strict=True)]
    for line in [header, *table]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    left = too_few_in_both(a, b)
    print(
        f"A: {args.a} ({a['preset']}); B: {args.b} ({b['preset']}); {spread(table)}"
        + (f"; {left} percentiles left out (too few samples in both runs)" if left else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
