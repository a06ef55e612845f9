"""Workload statistics in the paper's definitions, and the table that the dataset cards show.

Definitions follow the artifact's scripts/utils/analysis/chunk_arrival_characterization.py:
- append (crawler): chunk arrivals are the search step's end (meta["search_end"], when present)
  and every page event; gaps are differences of consecutive arrivals; the collection time is
  the last arrival.
- update (ANN): one chunk per pool (event); gaps are differences of the pool windows' starts
  (0, then each event's time but the last's, since a pool is delivered when its window ends);
  the duration is the last event's time.
Tokens per query: tokens of the final context (the retrieved text; the artifact counts the
pages' content for the crawler, query plus documents for ANN). Times are the modelled `t`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.traces import Trace
from bench.workloads.tokens import Counter

STATS_BEGIN = "<!-- stats:begin -->"
STATS_END = "<!-- stats:end -->"


def arrivals(trace: Trace) -> tuple[list[float], list[float]]:
    """(chunk arrival times, inter-chunk gaps) of one trace, in seconds."""
    times = [e.t for e in trace.events]
    if trace.mode == "append":
        search_end = trace.meta.get("search_end")
        arrived = ([float(search_end)] if search_end is not None else []) + times
        return arrived, list(np.diff(arrived))
    starts = [0.0] + times[:-1]
    return times, list(np.diff(starts))


def workload_stats(traces: Sequence[Trace], count_tokens: Counter) -> dict[str, Any]:
    tokens, prompt_tokens, chunks, gaps, durations, measured = [], [], [], [], [], []
    for trace in traces:
        final = trace.final_context
        tokens.append(count_tokens(final))
        prompt_tokens.append(count_tokens(trace.prompt(final)))
        arrived, trace_gaps = arrivals(trace)
        chunks.append(len(arrived))
        gaps.extend(trace_gaps)
        durations.append(trace.duration)
        if trace.events[-1].t_measured is not None:
            measured.append(trace.events[-1].t_measured)
    return {
        "queries": len(traces),
        "events": sum(len(t.events) for t in traces),
        "tokens_mean": _mean(tokens),
        "tokens_p95": _pct(tokens, 95),
        "tokens_max": max(tokens, default=None),
        "prompt_tokens_mean": _mean(prompt_tokens),
        "chunks_mean": _mean(chunks),
        "chunks_max": max(chunks, default=None),
        "gap_median": _pct(gaps, 50),
        "gap_p95": _pct(gaps, 95),
        "duration_mean": _mean(durations),
        "duration_p95": _pct(durations, 95),
        "measured_duration_mean": _mean(measured),
        "measured_duration_p95": _pct(measured, 95),
    }


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


_ROWS = (
    ("tokens per query, mean", "tokens_mean", "tokens"),
    ("tokens per query, P95", "tokens_p95", "tokens"),
    ("chunks per query, mean", "chunks_mean", "count"),
    ("chunks per query, max", "chunks_max", "int"),
    ("inter-chunk gap, median", "gap_median", "ms"),
    ("inter-chunk gap, P95", "gap_p95", "ms"),
    ("collection time, mean", "duration_mean", "s"),
    ("collection time, P95", "duration_p95", "s"),
    ("measured local time, mean", "measured_duration_mean", "ms"),
    ("measured local time, P95", "measured_duration_p95", "ms"),
)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "tokens" or unit == "int":
        return f"{value:,.0f}"
    if unit == "count":
        return f"{value:.2f}"
    if unit == "ms":
        return f"{value * 1000:,.1f} ms"
    return f"{value:.2f} s"


def stats_table(ours: dict[str, Any], paper: dict[str, Any]) -> str:
    """Markdown table: statistic | ours | paper."""
    lines = ["| statistic | ours | paper |", "| --- | ---: | ---: |"]
    for label, key, unit in _ROWS:
        lines.append(f"| {label} | {_fmt(ours.get(key), unit)} | {_fmt(paper.get(key), unit)} |")
    return "\n".join(lines)


def update_card(card: Path, table: str) -> bool:
    """Replace the text between the stats markers of an existing card; False if none."""
    if not card.exists():
        return False
    text = card.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(STATS_BEGIN) + r".*?" + re.escape(STATS_END), re.S)
    if not pattern.search(text):
        return False
    block = f"{STATS_BEGIN}\n{table}\n{STATS_END}"
    card.write_text(pattern.sub(lambda _: block, text), encoding="utf-8")
    return True
