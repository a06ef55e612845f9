"""Two configurations, each measured in several runs, pooled: how much faster is B than A?

    .venv/bin/python -m bench.pooled --a A1/results.json A2/results.json \\
        --b B1/results.json B2/results.json --mode stream-fcfs --base sessions

Each run is one `s2l bench` result. A configuration's runs are pooled: a query is named by its
run's seed and its id, so the same query drawn by two seeds' samples stays two queries, and
every repeat of it in the configuration's runs is one sample. For each configuration and
percentile this prints the speedup of `--mode` over `--base` (`base` TTFT percentile / `mode`'s,
both from the same runs, so each run's own machine speed cancels), and B's speedup over A's
(the ratio of the two), with a paired two-level bootstrap 95% interval (as the harness's,
`bench.harness.stats`): each draw takes each configuration's replays with replacement (the
same ones for its base and its mode, which ran beside each other), then query names with
replacement, and for each drawn query its samples in the drawn replays. A configuration's
replay j is, for each query, its j-th sample over the configuration's runs in the order given:
runs of one seed line up replay by replay; a query drawn by another seed's run takes its j-th
from that run. Queries in only one of A and B are left out (the line under the table counts
them).

Use it for a setting measured back to back in runs of the same queries (A with one value, B
with the other): the base mode (`wait` or SGLang's `sessions`, untouched by the setting) keeps
run-to-run drift out of the ratio.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.harness.stats import (
    BOOTSTRAP_DRAWS,
    CI_LEVEL,
    enough,
    percentile_rows,
    replay_picks,
    resample,
    too_few,
)

KEYS = ("p50", "p95", "p99")
Samples = dict[str, list[float]]


def samples(
    results: Sequence[dict], mode: str, workload: str | None = None, rate: float | None = None
) -> Samples:
    """TTFTs of `mode` per query name (`<seed>:<query id>`), over every run of `results`
    (of one workload and one arrival rate, if given: a run of several rates replays the same
    queries at each)."""
    out: Samples = {}
    for result in results:
        seed = result.get("config", {}).get("seed", 0)
        for run in result["runs"]:
            if run["mode"] != mode or (workload and run["workload"] != workload):
                continue
            if rate is not None and run.get("rate") != rate:
                continue
            for q in run["queries"]:
                ttft = q["ttft"] if q.get("error") is None and q.get("ttft") else float("inf")
                out.setdefault(f"{seed}:{q['query']}", []).append(ttft)
    return out


def _matrix(by_query: Samples, ids: Sequence[str]) -> np.ndarray:
    rows = [by_query[i] for i in ids]
    if len({len(r) for r in rows}) != 1:
        raise ValueError("queries have different numbers of samples; pool runs of one shape")
    return np.asarray(rows, dtype=float)


def compare(
    a: tuple[Samples, Samples],
    b: tuple[Samples, Samples],
    key: str,
    seed: int = 0,
    draws: int = BOOTSTRAP_DRAWS,
) -> dict:
    """(base, mode) samples of A and of B -> each one's speedup of mode over base at `key`
    and B's over A's, each {"value", "lo", "hi"}; {"insufficient": "n<100"} with too few."""
    ids = sorted(set(a[0]) & set(a[1]) & set(b[0]) & set(b[1]))
    mats = [_matrix(s, ids) for s in (*a, *b)] if ids else []
    n = min(m.size for m in mats) if mats else 0
    if not enough(key, n):
        return {"n": n, "queries": len(ids), "insufficient": too_few(key)}
    q = float(key.lstrip("p"))
    rng = np.random.default_rng(seed)
    picks = np.vstack([np.arange(len(ids)), rng.integers(0, len(ids), size=(draws, len(ids)))])
    cols = [  # each configuration's replays: its base and mode paired, A and B apart
        *replay_picks(rng, draws, mats[0].shape[1], mats[1].shape[1], first=True),
        *replay_picks(rng, draws, mats[2].shape[1], mats[3].shape[1], first=True),
    ]
    pct = [percentile_rows(resample(m, picks, c), q) for m, c in zip(mats, cols, strict=True)]
    with np.errstate(divide="ignore", invalid="ignore"):
        sa, sb = pct[0] / pct[1], pct[2] / pct[3]
        ratio = sb / sa
    alpha = (1 - CI_LEVEL) / 2 * 100

    def est(x: np.ndarray) -> dict:
        rest = x[1:][np.isfinite(x[1:])]
        lo, hi = np.percentile(rest, [alpha, 100 - alpha]) if rest.size else (np.nan, np.nan)
        return {"value": float(x[0]), "lo": float(lo), "hi": float(hi)}

    return {"n": n, "queries": len(ids), "a": est(sa), "b": est(sb), "b_over_a": est(ratio)}


def _fmt(e: dict) -> str:
    return f"{e['value']:.2f}x [{e['lo']:.2f}, {e['hi']:.2f}]"


def _load(paths: Sequence[Path]) -> list[dict]:
    from bench.harness.report import read_json

    return [read_json(Path(p)) for p in paths]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", nargs="+", type=Path, required=True, help="configuration A's runs")
    parser.add_argument("--b", nargs="+", type=Path, required=True, help="configuration B's runs")
    parser.add_argument("--mode", default="stream-fcfs", help="the mode the setting changes")
    parser.add_argument("--base", default="wait", help="the reference mode of the same runs")
    parser.add_argument("--workload", default=None, help="one workload (default: all)")
    parser.add_argument("--rate", type=float, default=None, help="one arrival rate (QPS)")
    args = parser.parse_args(argv)
    try:
        ra, rb = _load(args.a), _load(args.b)
        pick = {"workload": args.workload, "rate": args.rate}
        sa = (samples(ra, args.base, **pick), samples(ra, args.mode, **pick))
        sb = (samples(rb, args.base, **pick), samples(rb, args.mode, **pick))
        rows = [(key, compare(sa, sb, key)) for key in KEYS]
    except (OSError, ValueError, KeyError) as exc:
        print(f"bench.pooled: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.mode} over {args.base}: A ({len(ra)} runs) | B ({len(rb)} runs) | B / A")
    for key, r in rows:
        if "insufficient" in r:
            print(f"{key}: {r['insufficient']}")
        else:
            print(f"{key}: {_fmt(r['a'])} | {_fmt(r['b'])} | {_fmt(r['b_over_a'])}")
    r = rows[0][1]
    every = {name for s in (*sa, *sb) for name in s}
    print(
        f"{r['queries']} queries in both, {r['n']} samples per mode and configuration; "
        f"{len(every) - r['queries']} queries left out (not in every mode of A and B)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
