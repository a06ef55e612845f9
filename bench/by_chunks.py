"""Speedups over waiting split by how many chunks a query's context came in.

    .venv/bin/python -m bench.by_chunks RESULTS.json [RESULTS.json ...]

A query whose context came in one chunk has no speculative work of its own: streaming cannot
speed it up, only what other streams do can slow it down (their speculative work, and the
ranks the policy gives their final turns: under fcfs a stream ranks by its first chunk, so
streams opened earlier go first). Its speedup over `wait` is therefore what streaming costs a
final context, where the rule is that committed work never waits for speculative work by more
than one chunk; the queries of two or more chunks show what streaming gains.
Prints, per run, workload, rate and mode, the TTFT speedup over `wait` at p50 and p95 (with
the harness's paired bootstrap interval, `bench.harness.stats.speedup_ci`) for the queries of
one chunk, of two or more, and of all; and how much of their prompts was prefilled before the
final request (`prompt_tokens - unprefilled_at_finish`, mean tokens per query) with the number
of queries that had none prefilled then. For a stream that is the speculative work its final
context found done when it became final; for the other modes it is the final request's
prefix-cache hit, which for SGLang's `sessions` is taken when the last turn is sent, after
every earlier turn returned (`bench.harness.modes`), so all earlier chunks count by
construction. For streams, also how many finals carried a speculative turn of their stream
that was still queued when the context became final (the stream counter `promoted`, in each
record's `extra` since 2026-12-07; "-" for records without it, and for the other modes):
speculative work the scheduler had kept behind committed work (other streams' final turns,
plain requests) until then.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from bench.harness.aggregate import BASELINE, by_query, one_chunk
from bench.harness.report import fmt_speedup, read_json
from bench.harness.stats import speedup_ci

GROUPS: dict[str, Callable[[int], bool]] = {
    "1 chunk": one_chunk,
    "2+ chunks": lambda n: n >= 2,
    "all": lambda n: True,
}
KEYS = ("p50", "p95")


def table(result: dict, seed: int = 0) -> list[str]:
    """Markdown rows: one per workload, rate, mode (not `wait`) and group of queries."""
    groups: dict[tuple[str, float, str], list[dict]] = {}
    for run in result["runs"]:
        groups.setdefault((run["workload"], run["rate"], run["mode"]), []).append(run)
    lines = [
        "| workload | QPS | mode | queries | n | speedup p50 [95% CI] | p95 "
        "| prefilled ahead, mean tok | none ahead | final carried a queued turn |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (workload, rate, mode), runs in sorted(groups.items()):
        base_runs = groups.get((workload, rate, BASELINE))
        if mode == BASELINE or base_runs is None:
            continue
        for group, accept in GROUPS.items():
            ours, base = by_query(runs, accept), by_query(base_runs, accept)
            if not ours:
                continue
            cis = [speedup_ci(base, ours, k, seed) for k in KEYS]
            mean_ahead, none = ahead(runs, accept)
            lines.append(
                f"| {workload} | {rate:g} | `{mode}` | {group} | {len(ours)} | "
                + " | ".join(map(fmt_speedup, cis))
                + f" | {mean_ahead} | {none} | {carried(runs, accept)} |"
            )
    return lines


def ahead(runs: list[dict], accept: Callable[[int], bool]) -> tuple[str, str]:
    """Over every answered query record of `runs` whose chunk count `accept`s (answered as
    `QueryRecord.ok` says, the records the harness's "left at final chunk" column averages):
    the mean number of prompt tokens prefilled before its final request, and how many records
    had none ("-" where no record says what was left)."""
    done = [
        q["prompt_tokens"] - q["unprefilled_at_finish"]
        for run in runs
        for q in run["queries"]
        if accept(q.get("chunks", 0))
        and q.get("error") is None
        and q.get("first_token_at", 0) is not None
        and q.get("prompt_tokens") is not None
        and q.get("unprefilled_at_finish") is not None
    ]
    if not done:
        return "-", "-"
    return f"{sum(done) / len(done):,.0f}", f"{sum(1 for d in done if d <= 0)} of {len(done)}"


def carried(runs: list[dict], accept: Callable[[int], bool]) -> str:
    """Over the answered records of `runs` whose chunk count `accept`s and that say it (a
    stream's `extra["promoted"]`): how many finals carried tokens of a speculative turn still
    queued at the finish, as "k of n" ("-" where no record says)."""
    promoted = [
        (q.get("extra") or {}).get("promoted")
        for run in runs
        for q in run["queries"]
        if accept(q.get("chunks", 0)) and q.get("error") is None
    ]
    known = [p for p in promoted if p is not None]
    if not known:
        return "-"
    return f"{sum(1 for p in known if p > 0)} of {len(known)}"


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
