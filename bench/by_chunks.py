"""Speedups over waiting split by how many chunks a query's context came in.

    .venv/bin/python -m bench.by_chunks RESULTS.json [RESULTS.json ...]

A query whose context came in one chunk has no speculative work of its own: streaming cannot
speed it up, only other streams' speculative work can slow it down. Its speedup over `wait`
is therefore a direct measure of the rule that committed work never waits for speculative
work (more than one chunk); the queries of two or more chunks show what streaming gains.
Prints, per run, workload, rate and mode, the TTFT speedup over `wait` at p50 and p95 (with
the harness's paired bootstrap interval, `bench.harness.stats.speedup_ci`) for the queries of
one chunk, of two or more, and of all.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.harness.aggregate import ttft_of
from bench.harness.report import read_json
from bench.harness.stats import speedup_ci

GROUPS: dict[str, Callable[[int], bool]] = {
    "1 chunk": lambda n: n == 1,
    "2+ chunks": lambda n: n >= 2,
    "all": lambda n: True,
}
KEYS = ("p50", "p95")


def ttfts(runs: Iterable[dict]) -> dict[tuple[str, float, str], dict[str, list[float]]]:
    """(workload, rate, mode) -> query id -> its TTFTs over the repeats (+inf: no first
    token, as the harness counts a failure)."""
    out: dict[tuple[str, float, str], dict[str, list[float]]] = {}
    for run in runs:
        key = (run["workload"], run["rate"], run["mode"])
        for q in run.get("queries") or []:
            out.setdefault(key, {}).setdefault(q["query"], []).append(ttft_of(q))
    return out


def chunk_counts(runs: Iterable[dict]) -> dict[str, int]:
    """query id -> the number of chunks its context came in."""
    return {q["query"]: int(q["chunks"]) for run in runs for q in run.get("queries") or []}


def _cell(ci: dict) -> str:
    if ci.get("value") is None:
        return ci.get("insufficient") or "-"
    return f"{ci['value']:.2f}x [{ci['lo']:.2f}, {ci['hi']:.2f}]"


def table(result: dict, seed: int = 0) -> list[str]:
    """Markdown rows: one per workload, rate, mode (not `wait`) and group of queries."""
    runs = result["runs"]
    by_key, chunks = ttfts(runs), chunk_counts(runs)
    lines = [
        "| workload | QPS | mode | queries | n | speedup p50 [95% CI] | p95 |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for (workload, rate, mode), per_query in sorted(by_key.items()):
        base = by_key.get((workload, rate, "wait"))
        if mode == "wait" or base is None:
            continue
        for group, test in GROUPS.items():
            ids = [i for i in per_query if i in base and test(chunks[i])]
            if not ids:
                continue
            cis = [
                speedup_ci({i: base[i] for i in ids}, {i: per_query[i] for i in ids}, k, seed)
                for k in KEYS
            ]
            lines.append(
                f"| {workload} | {rate:g} | `{mode}` | {group} | {len(ids)} | "
                + " | ".join(map(_cell, cis))
                + " |"
            )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path, help="results.json files")
    args = ap.parse_args(argv)
    for path in args.results:
        result = read_json(path)
        print(f"## {path}\n")
        print("\n".join(table(result, result.get("config", {}).get("seed", 0))))
        print()


if __name__ == "__main__":
    main()
