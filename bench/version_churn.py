"""How much of an update-mode context survives its next version: can a stream tell ahead?

    .venv/bin/python -m bench.version_churn [TRACES] [--budget 1000] [--queries N --seed S]

For each update-mode trace (default: datasets/ann/traces.jsonl.xz, every trace, contexts cut to
`--budget` tokens as the presets cut them), the stream's prompt after each version is tokenized
with the embedded model's tokenizer (as `bench.harness.runner` does), and the longest common
token prefix of each version with the one before is taken as a share of the earlier version's
tokens. The final version's share is what prefilling the version before it in full keeps; one
minus it is what that prefill loses (`invalidated`). Printed:

- every trace: how much of the version before the final one the final version keeps (mean,
  and how many finals keep under 10% / over 90%), and the tokens a stream that prefills the
  version before the final one in full loses and keeps;
- the same split by what the stream saw before (the share kept between its earlier versions:
  the history a rule could judge from), to show whether that history predicts a final rewrite.

With `--queries N --seed S` only the traces a preset with that sample draws (`bench.harness.
queries.select`), e.g. cpu-quick's six (`--queries 6 --seed 0`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.harness.queries import build_query, select
from bench.tracefiles import read_any
from s2l_sglang.stream.tokens import lcp

DEFAULT = Path(__file__).resolve().parent.parent / "datasets" / "ann" / "traces.jsonl.xz"


def shares(prompts: Sequence[list[int]]) -> list[float]:
    """For each version after the first: its common prefix with the one before, as a share of
    the one before."""
    return [lcp(a, b) / max(len(a), 1) for a, b in itertools.pairwise(prompts)]


def churn(rows: Sequence[tuple[list[float], int]]) -> dict:
    """`rows`: each trace's shares (`shares`) and the token count of its version before the
    final one. Returns the summary over all traces and by history."""

    def summary(group: Sequence[tuple[list[float], int]]) -> dict:
        if not group:
            return {"traces": 0}
        final = [s[-1] for s, _ in group]
        return {
            "traces": len(group),
            "final_keeps_mean": sum(final) / len(final),
            "final_keeps_under_10pct": sum(f < 0.1 for f in final),
            "final_keeps_over_90pct": sum(f > 0.9 for f in final),
            "tokens_lost": round(sum((1 - s[-1]) * n for s, n in group)),
            "tokens_kept": round(sum(s[-1] * n for s, n in group)),
        }

    with_history = [r for r in rows if len(r[0]) >= 2]
    by_history = {
        "every earlier version rewrote its predecessor (all shares < 10%)": [
            r for r in with_history if max(r[0][:-1]) < 0.1
        ],
        "the last earlier version kept over 90%": [r for r in with_history if r[0][-2] > 0.9],
        "other histories": [
            r for r in with_history if max(r[0][:-1]) >= 0.1 and not r[0][-2] > 0.9
        ],
        "no history (two versions)": [r for r in rows if len(r[0]) < 2],
    }
    return {"all": summary(rows), "by_history": {k: summary(v) for k, v in by_history.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--budget", type=int, default=1000, help="context tokens (0: whole)")
    parser.add_argument("--queries", type=int, default=None, help="a preset's sample size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from bench.harness.runner import codec

    encode, decode = codec()
    traces = select(read_any(args.traces), args.queries, args.seed)
    if not traces or any(t.mode != "update" for t in traces):
        print("bench.version_churn: error: give update-mode traces", file=sys.stderr)
        return 2
    rows = []
    for t in traces:
        q = build_query(t, args.budget or None, encode, decode)
        if len(q.chunks) < 2:
            continue
        prompts = [encode(q.prompt(i)) for i in range(len(q.chunks))]
        prompts[-1] = encode(q.final_prompt)
        rows.append((shares(prompts), len(prompts[-2])))
    result = churn(rows)
    print(f"{args.traces} ({len(traces)} traces, {len(rows)} with two or more versions)")
    for name, s in [("all", result["all"]), *result["by_history"].items()]:
        if not s["traces"]:
            print(f"- {name}: none")
            continue
        print(
            f"- {name}: {s['traces']} traces; the final keeps {s['final_keeps_mean']:.0%} of the "
            f"version before on average ({s['final_keeps_under_10pct']} under 10%, "
            f"{s['final_keeps_over_90pct']} over 90%); prefilling that version in full loses "
            f"{s['tokens_lost']:,} tokens and keeps {s['tokens_kept']:,}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
