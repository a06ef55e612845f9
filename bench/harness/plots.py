"""PNG plots (matplotlib, Agg backend): TTFT CCDF, p95 TTFT against rate, speedup against
server utilization (95% intervals as error bars), and the per-chunk cost curve (`micro_chunk`).

The benchmark plots read the JSON form of the result (a failed query's TTFT is null, summaries
hold "inf"); a percentile from too few samples (null) is left out.
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


def _finite_or_none(v: Any) -> float | None:
    if v is None:
        return None
    v = _as_float(v)
    return v if math.isfinite(v) else None


def plot_p95_vs_rate(result: dict, path: Path) -> None:
    """p95 TTFT (pooled over repeats) against the arrival rate, one line per mode, one panel per
    workload; a rate with fewer than 20 samples has no point."""
    plt = _pyplot()
    entries = result.get("comparisons", [])
    workloads = list(dict.fromkeys(c["workload"] for c in entries)) or ["-"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 3.8), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        mine = [c for c in entries if c["workload"] == w]
        plotted = False
        for mode in dict.fromkeys(c["mode"] for c in mine):
            pts = sorted(
                (c["rate"], _finite_or_none(c["ttft_s"]["p95"])) for c in mine if c["mode"] == mode
            )
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=mode)
                plotted = True
        rates = sorted({c["rate"] for c in mine})
        if rates:
            ax.set_xticks(rates, [f"{r:.3g}" for r in rates])
        if len(rates) == 1:
            ax.set_xlim(rates[0] * 0.5, rates[0] * 1.5)
        ax.set_xlabel("arrival rate (queries/s)")
        ax.set_ylabel("p95 TTFT (s)")
        if plotted:
            ax.set_yscale("log")
            _plain_log_axis(ax.yaxis)
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "too few samples for p95 (n<20)", ha="center", transform=ax.transAxes)
        ax.set_title(w)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"p95 TTFT against rate ({result['preset']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup_vs_utilization(result: dict, path: Path) -> None:
    """TTFT speedup over `wait` against server utilization, per mode, with 95% intervals:
    one panel per workload (rows) and percentile (p50, p95: columns)."""
    plt = _pyplot()
    entries = [c for c in result.get("comparisons", []) if c.get("speedup") and c["mode"] != "wait"]
    workloads = list(dict.fromkeys(c["workload"] for c in entries)) or ["-"]
    keys = ("p50", "p95")
    fig, axes = plt.subplots(
        len(workloads), len(keys), figsize=(5.5 * len(keys), 3.8 * len(workloads)), squeeze=False
    )
    for i, w in enumerate(workloads):
        for j, key in enumerate(keys):
            ax = axes[i][j]
            plotted = False
            mine = [c for c in entries if c["workload"] == w]
            for mode in dict.fromkeys(c["mode"] for c in mine):
                pts = []
                for c in mine:
                    sp = c["speedup"].get(key) or {}
                    x, y = c.get("utilization", c["rate"]), _finite_or_none(sp.get("value"))
                    if c["mode"] == mode and y is not None:
                        lo, hi = _finite_or_none(sp.get("lo")), _finite_or_none(sp.get("hi"))
                        lo, hi = y if lo is None else lo, y if hi is None else hi
                        pts.append((x, y, y - min(lo, y), max(hi, y) - y))
                if pts:
                    pts.sort()
                    xs, ys, lo, hi = zip(*pts, strict=True)
                    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=mode)
                    plotted = True
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            has_util = any("utilization" in c for c in mine)
            ax.set_xlabel("server utilization" if has_util else "arrival rate (queries/s)")
            ax.set_ylabel(f"{key} TTFT speedup over wait")
            ax.set_title(f"{w}, {key}")
            if plotted:
                ax.legend(fontsize=7)
            else:
                need = "n<20" if key == "p95" else "no data"
                ax.text(0.5, 0.5, f"too few samples ({need})", ha="center", transform=ax.transAxes)
            ax.grid(True, alpha=0.3)
    fig.suptitle(f"TTFT speedup against utilization, 95% CI ({result['preset']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_chunk_cost(data: dict, path: Path) -> None:
    """Per-chunk cost against context length: each method's acknowledgement time of a 16-token
    append (left) and the stream manager's own time per append() call (right)."""
    plt = _pyplot()
    fig, (ack, call) = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, points in data["methods"].items():
        xs = [p["context_tokens"] for p in points if p.get("ack_s") is not None]
        ys = [p["ack_s"] * 1e3 for p in points if p.get("ack_s") is not None]
        ack.plot(xs, ys, marker=".", ms=3, lw=0.8, label=name)
        calls = [(p["context_tokens"], p["call_s"] * 1e3) for p in points if p.get("call_s")]
        if calls:
            call.plot(*zip(*calls, strict=True), marker=".", ms=3, lw=0.8, label=name)
    ack.set_xlabel("context length (tokens)")
    ack.set_ylabel(f"ack of a {data['chunk_tokens']}-token append (ms)")
    ack.set_yscale("log")
    _plain_log_axis(ack.yaxis)
    call.set_xlabel("context length (tokens)")
    call.set_ylabel("append() call (ms)")
    for ax in (ack, call):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"per-chunk cost ({data['model']}, {data['dtype']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
