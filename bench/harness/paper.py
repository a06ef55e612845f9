"""The paper's regime: its hardware's prefill rate, its workloads' sizes, its headline results,
and the mapping of its arrival rates onto this machine at equal server utilization.

Stream2LLM (MLSys 2026) served Llama-3.1-8B-Instruct on 2x H200 (TP=2, a prefill-only
instance, 1 output token). The paper publishes no prefill rate, so it is estimated:

    H200 SXM dense BF16 989.5 TFLOP/s (NVIDIA's datasheet: 1,979 TFLOP/s "with sparsity")
    x 40% model FLOP utilization (assumed; long-prompt prefill typically reaches 35-50%)
    x 2 GPUs / (2 x 8.03e9 FLOP per token, Llama-3.1-8B's parameters; attention left out)
    = 49,300 tokens/s

Our traces keep the paper's shapes (chunk counts and gaps, a modelled timeline calibrated to the
paper's statistics) but were generated with at most 6,000 SmolLM2 tokens per query, under
SmolLM2's 8,192-token context. On this machine:

- the timeline is stretched by `paper rate / local rate` (the local rate: tokens per second of
  the speed probe at the start of the run), so a chunk gap is worth as many prefilled tokens as
  on the paper's hardware;
- each paper arrival rate q maps to the local rate with the same server utilization,
  utilization = arrival rate x mean prefill work per query / prefill rate:
  local QPS = q x (paper tokens per query / paper rate) x (local rate / local tokens per query).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

H200_BF16_DENSE_FLOPS = 989.5e12
ASSUMED_MFU = 0.40
LLAMA_8B_PARAMS = 8.03e9
PAPER_PREFILL_TOK_S = H200_BF16_DENSE_FLOPS * ASSUMED_MFU * 2 / (2 * LLAMA_8B_PARAMS)
PAPER_RATE_SOURCE = (
    "estimate (the paper gives no prefill rate): H200 dense BF16 989.5 TFLOP/s x 40% MFU "
    "(assumed) x 2 GPUs / (2 x 8.03e9 FLOP per token of Llama-3.1-8B) = "
    f"{PAPER_PREFILL_TOK_S:,.0f} tokens/s"
)
# Tokens per query in the paper's traces (Llama tokens of the final context; its section 5).
PAPER_TOKENS = {"crawler": 8889.0, "ann": 13006.0}


@dataclass(frozen=True)
class PaperRow:
    """One of the paper's headline speedups over non-streaming (TTFT ratio at a percentile)."""

    workload: str
    qps: float  # the paper's arrival rate
    percentile: str  # "p50" | "p95" | "p99"
    speedup: float
    policy: str = "fcfs"


PAPER_ROWS = (
    PaperRow("crawler", 0.5, "p50", 3.9),
    PaperRow("crawler", 1.0, "p50", 4.3),
    PaperRow("crawler", 4.0, "p50", 11.0),
    PaperRow("crawler", 4.0, "p95", 7.0),
    PaperRow("ann", 1.0, "p95", 2.6),
    PaperRow("ann", 2.0, "p95", 2.3),
)


@dataclass(frozen=True)
class PaperRegime:
    """How a preset maps the paper's setting onto this machine (`Preset.paper`).

    The preset's workload rates are then the paper's QPS; the run converts them."""

    prefill_tok_s: float = PAPER_PREFILL_TOK_S
    source: str = PAPER_RATE_SOURCE
    tokens: Mapping[str, float] = field(default_factory=lambda: dict(PAPER_TOKENS))
    rows: tuple[PaperRow, ...] = PAPER_ROWS

    def utilization(self, workload: str, paper_qps: float) -> float:
        """The paper's server utilization at `paper_qps` (arrival rate x work / rate)."""
        return paper_qps * self.tokens[workload] / self.prefill_tok_s

    def delay_scale(self, local_tok_s: float) -> float:
        """How much slower this machine prefills: the factor on every chunk time."""
        if local_tok_s <= 0:
            raise ValueError(f"local prefill rate must be > 0, got {local_tok_s}")
        return self.prefill_tok_s / local_tok_s

    def local_qps(
        self, workload: str, paper_qps: float, local_tok_s: float, local_tokens: float
    ) -> float:
        """The local arrival rate with the paper's utilization at `paper_qps`."""
        if local_tokens <= 0:
            raise ValueError(f"mean tokens per query must be > 0, got {local_tokens}")
        return self.utilization(workload, paper_qps) * local_tok_s / local_tokens


def calibrate(
    regime: PaperRegime,
    paper_rates: Mapping[str, Sequence[float]],
    local_tok_s: float,
    local_tokens: Mapping[str, float],
    paper_names: Mapping[str, str] | None = None,
) -> dict:
    """The run's mapping: delay scale and, per workload, (paper QPS, utilization, local QPS).

    `paper_names`: the paper workload each of ours stands for (default: the same name; a trace
    file's workload stands for the paper's workload of its trace mode)."""
    names = {w: (paper_names or {}).get(w, w) for w in paper_rates}
    rates = {
        w: [
            {
                "paper_qps": q,
                "utilization": regime.utilization(names[w], q),
                "local_qps": regime.local_qps(names[w], q, local_tok_s, local_tokens[w]),
            }
            for q in qs
        ]
        for w, qs in paper_rates.items()
    }
    return {
        "paper_prefill_tok_s": regime.prefill_tok_s,
        "paper_rate_source": regime.source,
        "paper_tokens_per_query": dict(regime.tokens),
        "local_prefill_tok_s": local_tok_s,
        "local_tokens_per_query": dict(local_tokens),
        "delay_scale": regime.delay_scale(local_tok_s),
        "paper_names": names,
        "rates": rates,
    }


def paper_rows_for(calibration: dict, rows: Sequence[PaperRow]) -> list[dict]:
    """The paper's rows that this run covers, each with the local rate it maps to."""
    out = []
    for ours, paper_name in calibration.get("paper_names", {}).items():
        for row in rows:
            if row.workload != paper_name:
                continue
            for r in calibration["rates"][ours]:
                if abs(r["paper_qps"] - row.qps) < 1e-9:
                    out.append(
                        {**row.__dict__, "workload": ours, "paper_workload": paper_name,
                         "local_qps": r["local_qps"], "util": r["utilization"]}
                    )  # fmt: skip
    return out


def paper_name_for(workload: str, trace_mode: str, tokens: Mapping[str, float]) -> str:
    """The paper workload ours stands for: its own name, else by trace mode (append: crawler)."""
    if workload in tokens:
        return workload
    return "crawler" if trace_mode == "append" else "ann"
