"""PNG plots of a benchmark result (matplotlib, Agg backend): TTFT CCDF, p95 TTFT against rate.

Both read the JSON form of the result (a failed query's TTFT is null, summaries hold "inf").
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.harness.metrics import ccdf, groups


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_log_axis(axis: Any) -> None:
    """Log-scale tick labels as plain numbers (2, 3, 0.5) rather than 2x10^0."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(fmt)
    axis.set_minor_locator(LogLocator(subs=(2, 5)))
    axis.set_minor_formatter(fmt)


def _as_float(v: Any) -> float:
    return float("inf") if v == "inf" or v is None else float(v)


def plot_ccdf(result: dict, path: Path) -> None:
    """TTFT CCDF per mode: one panel per workload (rows) and rate (columns)."""
    plt = _pyplot()
    by_run = groups(result["runs"])
    workloads = list(dict.fromkeys(w for w, _ in by_run))
    rates = {w: [r for ww, r in by_run if ww == w] for w in workloads}
    cols = max(len(v) for v in rates.values())
    fig, axes = plt.subplots(
        len(workloads), cols, figsize=(5.5 * cols, 3.8 * len(workloads)), squeeze=False
    )
    for i, w in enumerate(workloads):
        for j in range(cols):
            ax = axes[i][j]
            if j >= len(rates[w]):
                ax.axis("off")
                continue
            rate = rates[w][j]
            for run in by_run[(w, rate)]:
                ttft = [_as_float(q["ttft"]) for q in run["queries"]]
                x, y = ccdf(ttft)
                failed = sum(math.isinf(t) for t in ttft)
                label = run["mode"] + (f" ({failed} failed)" if failed else "")
                if len(x):  # P(TTFT >= t) is y_i on (x_(i-1), x_i]: a "pre" step
                    ax.step(x, y, where="pre", label=label, marker=".")
                else:
                    ax.plot([], [], label=label)
            ax.set_xscale("log")
            ax.set_yscale("log")
            _plain_log_axis(ax.xaxis)
            _plain_log_axis(ax.yaxis)
            ax.set_xlabel("TTFT (s)")
            ax.set_ylabel("P(TTFT >= x)")
            ax.set_title(f"{w}, {rate:g} QPS")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"TTFT CCDF ({result['preset']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_p95_vs_rate(result: dict, path: Path) -> None:
    """p95 TTFT against the arrival rate, one line per mode, one panel per workload."""
    plt = _pyplot()
    workloads = list(dict.fromkeys(r["workload"] for r in result["runs"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 3.8), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        modes = list(dict.fromkeys(r["mode"] for r in result["runs"] if r["workload"] == w))
        for mode in modes:
            pts = sorted(
                (r["rate"], _as_float(r["summary"]["ttft_s"]["p95"]))
                for r in result["runs"]
                if r["workload"] == w and r["mode"] == mode
            )
            xs = [x for x, y in pts if math.isfinite(y)]
            ys = [y for x, y in pts if math.isfinite(y)]
            ax.plot(xs, ys, marker="o", label=mode)
        rates = sorted({r["rate"] for r in result["runs"] if r["workload"] == w})
        ax.set_xticks(rates)
        if len(rates) == 1:
            ax.set_xlim(rates[0] * 0.5, rates[0] * 1.5)
        ax.set_xlabel("arrival rate (queries/s)")
        ax.set_ylabel("p95 TTFT (s)")
        ax.set_yscale("log")
        _plain_log_axis(ax.yaxis)
        ax.set_title(w)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"p95 TTFT against rate ({result['preset']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
