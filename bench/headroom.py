"""What a stream could at best have prefilled before its final chunk, against what it did.

    .venv/bin/python -m bench.headroom RESULTS.json [--mode stream-fcfs] [--margin 200]

For each query of a benchmark run (`s2l bench`'s results.json; the workloads, sample, seed,
token budget and delay scale are read from it, so the queries are those the run replayed), the
*oracle's* tokens at finish are the final prompt's tokens past its longest common token prefix
with any earlier version of the prompt: what a stream that had prefilled every earlier version
in full, and kept the best of them, would still prefill when the final chunk lands. Prompts
are tokenized with the run's model's tokenizer, as the harness does (`runner.codec`). Printed per workload
and streaming mode, against the tokens the stream left to prefill at its finish
(`unprefilled_at_finish`, reported by the server):

- the mean tokens left at finish, the oracle's mean, and how many queries left more than
  `--margin` tokens beyond the oracle's;
- the same for the slowest tenth of the queries by TTFT (the tail), to show whether the tail
  is prefill the stream could have done ahead (scheduling, KV) or work no stream could avoid.

It reads no engine and writes nothing; a second CPU process beside a benchmark skews its
timings, so run it after one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.harness.queries import Query, load_queries
from s2l_sglang.stream.tokens import lcp


def oracle_left(prompts: Sequence[list[int]]) -> int:
    """Tokens of the last of `prompts` (the final prompt) past its longest common prefix with
    any earlier one (all of it if it is the only one)."""
    final = prompts[-1]
    best = max((lcp(p, final) for p in prompts[:-1]), default=0)
    return len(final) - best


def query_oracle(q: Query, encode: Callable[[str], list[int]]) -> int:
    """`oracle_left` of query `q`'s prompts, each version's and the final one."""
    prompts = [encode(q.prompt(i)) for i in range(len(q.chunks) - 1)]
    return oracle_left([*prompts, encode(q.final_prompt)])


def summarize(rows: Sequence[tuple[float, int, int]], margin: int) -> dict:
    """`rows`: (ttft, left at finish, oracle's left) per query. The means and the count over
    the margin, for all queries and for the slowest tenth by TTFT."""

    def part(group: Sequence[tuple[float, int, int]]) -> dict:
        n = len(group)
        return {
            "queries": n,
            "left_mean": sum(r[1] for r in group) / n if n else 0.0,
            "oracle_mean": sum(r[2] for r in group) / n if n else 0.0,
            "over_margin": sum(r[1] - r[2] > margin for r in group),
        }

    ranked = sorted(rows, key=lambda r: r[0], reverse=True)
    return {"all": part(rows), "slowest_tenth": part(ranked[: max(1, len(rows) // 10)])}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="an `s2l bench` results.json")
    parser.add_argument("--mode", action="append", help="streaming modes (default: every one)")
    parser.add_argument("--margin", type=int, default=200, help="tokens beyond the oracle's")
    args = parser.parse_args(argv)
    data = json.loads(args.results.read_text())
    cfg = data["config"]
    from bench.harness.runner import codec

    encode, decode = codec(cfg.get("model_path"))
    oracle: dict[str, dict[str, int]] = {}
    for wl in cfg["workloads"]:
        qs = load_queries(
            wl["file"], wl["queries"], cfg["seed"], cfg.get("max_context_tokens"), encode,
            decode, cfg.get("delay_scale", 1.0),
        )  # fmt: skip
        oracle[wl["name"]] = {q.id: query_oracle(q, encode) for q in qs}
    print(f"{args.results}: oracle = tokens past the final prompt's longest common prefix with")
    print(f"any earlier version; 'over' = queries left more than {args.margin} beyond it")
    for run in data["runs"]:
        mode = run["mode"]
        if not mode.startswith("stream") or (args.mode and mode not in args.mode):
            continue
        known = oracle.get(run["workload"], {})
        rows = [
            (q["ttft"], q["unprefilled_at_finish"], known[q["query"]])
            for q in run["queries"]
            if q.get("error") is None
            and q.get("unprefilled_at_finish") is not None
            and q["query"] in known
        ]
        if not rows:
            continue
        s = summarize(rows, args.margin)
        a, t = s["all"], s["slowest_tenth"]
        print(
            f"- {run['workload']} {mode} @ {run['rate']} (repeat {run.get('repeat', 0)}): "
            f"{a['queries']} queries left {a['left_mean']:.0f} tokens at finish on average, the "
            f"oracle {a['oracle_mean']:.0f}, {a['over_margin']} over; slowest {t['queries']}: "
            f"left {t['left_mean']:.0f}, oracle {t['oracle_mean']:.0f}, {t['over_margin']} over"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
