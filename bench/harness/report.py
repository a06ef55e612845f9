"""Result files of a benchmark: results.json, results.md and the PNG plots (`plots`).

`result` is the dict `runner.run_bench` builds: the header (preset, command, machine, date,
config, interleaving, speed probe, lower bound, paper calibration), `runs` (one per replay, in
run order, with its summary, drift flag and query records) and `comparisons` (one per workload x
rate x mode, pooled over repeats, with bootstrap intervals of the speedups over `wait`).
The markdown's sections and columns are explained in bench/README.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from bench.harness.metrics import KEYS, mode_rank
from bench.harness.plots import plot_ccdf, plot_p95_vs_rate, plot_speedup_vs_utilization
from bench.harness.stats import BOOTSTRAP_DRAWS, MIN_SAMPLES, enough, too_few

CCDF_PNG = "ttft_ccdf.png"
P95_PNG = "ttft_p95_vs_rate.png"
SPEEDUP_PNG = "speedup_vs_utilization.png"


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _finite(obj: Any) -> Any:
    """JSON has no infinity: +inf becomes the string "inf" (a failed query), NaN becomes null."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        return "inf" if math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def write_json(result: dict, path: Path) -> None:
    path.write_bytes(
        orjson.dumps(_finite(result), option=orjson.OPT_INDENT_2, default=_json_default)
    )


def read_json(path: Path) -> dict:
    return orjson.loads(Path(path).read_bytes())


# ---- formatting -----------------------------------------------------------------------------


def _float(v: float | str | None) -> float | None:
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def fmt_s(v: float | str | None) -> str:
    """Seconds, 3 significant digits; a failure (inf) shows as "fail"."""
    v = _float(v)
    if v is None:
        return "-"
    if math.isinf(v):
        return "fail"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def fmt_x(v: float | str | None) -> str:
    """A ratio as "2.31x"."""
    v = _float(v)
    if v is None:
        return "-"
    return "inf" if math.isinf(v) else f"{v:.2f}x"


def fmt_pct(stats: dict, key: str, fmt=fmt_s) -> str:
    """A percentile of a {"p50", ..., "n"} dict: `n<20` when it had too few samples."""
    n = stats.get("n")
    if n is not None and not enough(key, int(n)):
        return too_few(key)
    return fmt(stats.get(key))


def fmt_speedup(sp: dict | None) -> str:
    """ "2.31x [1.90, 2.80]": the speedup and its 95% interval; `n<20` from too few samples."""
    if not sp:
        return "-"
    if sp.get("insufficient"):
        return sp["insufficient"]
    if sp.get("value") is None:
        return "-"
    lo, hi = _float(sp.get("lo")), _float(sp.get("hi"))
    ci = f" [{fmt_x(lo)[:-1]}, {fmt_x(hi)[:-1]}]" if lo is not None and hi is not None else ""
    return fmt_x(sp["value"]) + ci


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("| " + " | ".join("---" if i == 0 else "---:" for i in range(len(header))) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _tokens(v: float | None) -> str:
    return "-" if v is None else f"{float(v):.0f}"


def _preempted(pre: dict | None) -> str:
    if not pre:
        return "n/a"
    if not pre.get("swap"):
        return str(pre.get("recompute", 0))
    return f"{pre['recompute'] + pre['swap']} ({pre['recompute']} recompute, {pre['swap']} swap)"


# ---- sections -------------------------------------------------------------------------------

COMPARISON_HEADER = [
    "mode", "replays", "ok", "TTFT p50 s", "p95 s", "p99 s", "speedup p50 [95% CI]", "p95",
    "p99", "TTFT/bound p50", "bound faults", "completion vs wait", "left at final chunk (tok)",
    "prefilled tok", "invalidated tok", "preemptions", "drift-flagged",
]  # fmt: skip


def comparison_rows(entries: list[dict]) -> list[list[str]]:
    rows = []
    for c in entries:
        sp, tok = c.get("speedup") or {}, c["tokens_per_replay"]
        n = c["ttft_s"]["n"]
        rows.append(
            [
                f"`{c['mode']}`",
                str(c["repeats"]),
                f"{n - c['failed']}/{n}",
                *(fmt_pct(c["ttft_s"], k) for k in KEYS),
                *(
                    "baseline" if c["mode"] == "wait" else fmt_speedup(sp.get(k)) if sp else "-"
                    for k in KEYS
                ),
                fmt_pct(c.get("ttft_over_bound") or {}, "p50", fmt_x),
                str(c["bound_faults"]),
                fmt_x(c.get("completion_ratio")),
                _tokens(tok.get("unprefilled_at_finish_mean")),
                _tokens(tok.get("prefilled")),
                _tokens(tok.get("invalidated")),
                _preempted(c.get("preemptions")),
                f"{c['drift_flagged']}/{c['repeats']}",
            ]
        )
    return rows


def peer_rows(entries: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the stream modes' speedups over SGLang's peers (`vs_peers`)."""
    peers = list(dict.fromkeys(p for c in entries for p in c.get("vs_peers") or {}))
    header = ["mode"] + [f"over `{p}` {k}" for p in peers for k in KEYS]
    rows = [
        [f"`{c['mode']}`"]
        + [fmt_speedup((c["vs_peers"].get(p) or {}).get(k)) for p in peers for k in KEYS]
        for c in entries
        if c.get("vs_peers")
    ]
    return header, rows


REPLAY_HEADER = [
    "#", "workload", "QPS", "mode", "repeat", "policy", "probe s", "probe vs median",
    "bound samples", "replay s", "ok", "TTFT p50 s", "bound faults",
]  # fmt: skip


def one_chunk_rows(entries: list[dict]) -> list[list[str]]:
    """Per mode with `one_chunk`: the queries of one chunk and their speedup over `wait`."""
    return [
        [f"`{c['mode']}`", str(c["one_chunk"]["queries"])]
        + [fmt_speedup(c["one_chunk"].get(k)) for k in KEYS]
        for c in entries
        if c.get("one_chunk")
    ]


def replay_rows(runs: list[dict]) -> list[list[str]]:
    rows = []
    for run in sorted(runs, key=lambda r: r.get("order", 0)):
        s, d = run["summary"], run.get("drift") or {}
        dev = d.get("deviation")
        flag = "-" if dev is None else f"{dev:+.0%}" + (" **flagged**" if d.get("flagged") else "")
        rows.append(
            [
                str(run.get("order", "")),
                run["workload"],
                f"{run['rate']:.3g}",
                f"`{run['mode']}`",
                str(run.get("repeat", 0)),
                run.get("policy", ""),
                fmt_s(run.get("probe_s")),
                flag,
                str(run.get("bound_samples", 0)),
                fmt_s(run.get("replay_wall_s")),
                f"{s['queries'] - s['failed']}/{s['queries']}",
                fmt_pct(s["ttft_s"], "p50"),
                str(run.get("bound_faults", 0)),
            ]
        )
    return rows


def paper_rows(result: dict) -> list[str]:
    cal = result.get("paper_regime")
    if not cal:
        return []
    lines = ["## Beside the paper", ""]
    lines.append(
        f"Paper hardware: {cal['paper_rate_source']}. This machine: "
        f"{cal['local_prefill_tok_s']:.0f} tokens/s (speed probe at the start, "
        f"{cal['probe_tokens']}-token prompts), so every chunk time is x{cal['delay_scale']:.1f}; "
        "each paper rate maps to the local rate of equal utilization (rate x mean tokens per "
        "query / prefill rate; paper tokens per query: "
        + ", ".join(f"{w} {t:,.0f}" for w, t in cal["paper_tokens_per_query"].items())
        + "; ours: "
        + ", ".join(f"{w} {t:,.0f}" for w, t in cal["local_tokens_per_query"].items())
        + ")."
    )
    lines.append("")
    by_key = {(c["workload"], c["rate"], c["mode"]): c for c in result.get("comparisons", [])}
    rows = []
    for row in cal.get("rows", []):
        ours = by_key.get((row["workload"], row["local_qps"], f"stream-{row['policy']}"))
        sp = ((ours or {}).get("speedup") or {}).get(row["percentile"])
        value = _float((sp or {}).get("value"))
        rows.append(
            [
                row["workload"],
                f"{row['qps']:g}",
                f"{row['util']:.2f}",
                f"{row['local_qps']:.3g}",
                row["percentile"].upper(),
                f"{row['speedup']:.1f}x ({row['policy'].upper()})",
                fmt_speedup(sp) if ours else "not run",
                fmt_x(value / row["speedup"]) if value is not None else "-",
            ]
        )
    header = [
        "workload", "paper QPS", "utilization", "our QPS", "percentile", "paper speedup",
        "ours [95% CI]", "ours / paper",
    ]  # fmt: skip
    lines += _table(header, rows) if rows else ["(no row of the paper at these rates)"]
    return lines + [""]


def _stream_settings(engines: list[dict]) -> str:
    """The scheduling settings in force (older results, and servers, do not record them)."""
    config = next((e["stream_config"] for e in engines if e.get("stream_config")), None)
    if config is None:
        return ""
    keys = (
        "speculative_chunk",
        "speculative_chunk_source",
        "speculative_reserve",
        "hold_back",
        "pipelined_finish",
        "publish_at_close",
    )
    return "; stream settings " + ", ".join(f"{k} {config.get(k)}" for k in keys if k in config)


def _header(result: dict) -> list[str]:
    cfg, machine = result["config"], result["machine"]
    starts = ", ".join(f"{e['policy']} {e['start_s']:.0f} s" for e in result["engines"])
    probe, inter = result.get("probe") or {}, result.get("interleave") or {}
    lb = result["lower_bound"]
    n_runs = len(result["runs"])
    return [
        f"# `s2l bench --preset {result['preset']}`",
        "",
        result.get("description", ""),
        "",
        f"- command: `{result['command']}`",
        f"- date: {result['date']}; wall time {result['wall_s']:.0f} s "
        f"(engine starts: {starts or 'none'})",
        f"- machine: {machine['nproc']} CPUs (`nproc`), {machine['cpu_model']}; "
        f"GPU: {machine.get('gpu') or 'none'}; load average at start {machine['load_start']}, "
        f"at end {machine['load_end']} (CPU pressure: the share of time runnable tasks waited "
        "for a core; other jobs may share the machine)",
        f"- code: {machine.get('git', '?')}; SGLang {machine.get('sglang', '?')}, "
        f"torch {machine.get('torch', '?')}",
        f"- model: {cfg['model']}; engine arguments {cfg['engine_kwargs'] or '{}'}; "
        f"{'in-process engine' if cfg['target'] == 'engine' else 'HTTP server ' + cfg['target']}"
        + _stream_settings(result["engines"]),
        "- queries: "
        + ", ".join(
            f"{w['name']} {w['queries']} at {', '.join(f'{r:.3g}' for r in w['rates'])} QPS"
            for w in cfg["workloads"]
        )
        + f" (seeded sample, seed {cfg['seed']}); contexts cut to "
        f"{cfg['max_context_tokens'] or 'no'} tokens; chunk delays x{cfg['delay_scale']:.3g}; "
        f"{cfg['max_new_tokens']} output token(s)",
        f"- interleaving: {inter.get('method', '?')}; {n_runs} replays, {inter.get('repeats', 1)} "
        f"repeat(s), order shuffled per repeat (seed {inter.get('seed', 0)}); see "
        "'Replays in run order'",
        f"- speed probe before each replay: {probe.get('tokens')} tokens from an empty cache, "
        f"median {fmt_s(probe.get('median_s'))} s"
        + (f" ({probe['prefill_tok_s']:.0f} tokens/s)" if probe.get("prefill_tok_s") else "")
        + f"; {probe.get('flagged', 0)} of {n_runs} replays flagged (probe more than "
        f"{probe.get('margin', 0.25):.0%} from the median: measured on a differently loaded "
        "machine)",
        f"- lower bound: {lb['method']}; **{result.get('bound_faults', 0)} measurement "
        "fault(s)** (a TTFT under 0.95x its bound: not a result; left out of TTFT/bound)",
        f"- preemptions: {result['sched_note']}",
        "",
        "TTFT: from the final chunk's scheduled arrival (with the question) to the first output "
        "token, measured by the client. Percentiles pool every repeat's queries and are printed "
        "only from enough samples (p50 from "
        f"{MIN_SAMPLES['p50']}, p95 from {MIN_SAMPLES['p95']}, p99 from {MIN_SAMPLES['p99']}; "
        "`n<20` otherwise: with fewer, a p95 is just the largest sample). Speedup = `wait`'s "
        "TTFT percentile / this mode's (>1 is faster), with a bootstrap 95% interval "
        f"({BOOTSTRAP_DRAWS} draws, seeded) that resamples the repeats (paired by round), then "
        "the queries (paired by id). `fail` = no first token (timeout or error). Completion `vs wait`: this "
        "mode's completion time / wait's, mean over repeats. Token columns are per replay.",
        "",
    ]


def markdown(result: dict, figures: bool = True) -> str:
    lines = _header(result)
    lines += paper_rows(result)
    entries = result.get("comparisons", [])
    groups: dict[tuple[str, float], list[dict]] = {}
    for c in sorted(entries, key=lambda c: mode_rank(c["mode"])):
        groups.setdefault((c["workload"], c["rate"]), []).append(c)
    workloads = list(dict.fromkeys(c["workload"] for c in entries))
    for (workload, rate), group in sorted(
        groups.items(), key=lambda kv: (workloads.index(kv[0][0]), kv[0][1])
    ):
        util = group[0].get("utilization")
        extra = f", utilization {util:.2f}" if util is not None else ""
        lines += [f"## {workload} ({group[0]['trace_mode']} mode), {rate:.3g} QPS{extra}", ""]
        lines += _table(COMPARISON_HEADER, comparison_rows(group))
        header, rows = peer_rows(group)
        if rows:
            lines += ["", "Streams against SGLang's own peers (the peer's TTFT percentile / the "
                      "stream mode's, same bootstrap; >1: the stream is faster):", ""]  # fmt: skip
            lines += _table(header, rows)
        rows = one_chunk_rows(group)
        if rows:
            lines += ["", "Queries whose context came in one chunk (no speculative work of their "
                      "own: streaming can only cost them), speedup over `wait`:", ""]  # fmt: skip
            lines += _table(["mode", "queries", "p50 [95% CI]", "p95", "p99"], rows)
        errors = sorted(
            {(r["mode"], e) for r in result["runs"]
             if (r["workload"], r["rate"]) == (workload, rate) for e in r["summary"]["errors"]}
        )  # fmt: skip
        if errors:
            lines += ["", "Errors: " + "; ".join(f"`{m}`: {e}" for m, e in errors)]
        lines.append("")
    lines += ["## Replays in run order", ""]
    lines += _table(REPLAY_HEADER, replay_rows(result["runs"]))
    if figures:
        lines += ["", f"![TTFT CCDF]({CCDF_PNG})", "", f"![p95 TTFT against rate]({P95_PNG})"]
        lines += ["", f"![speedup against utilization]({SPEEDUP_PNG})"]
    return "\n".join(lines) + "\n"


def write_markdown(result: dict, path: Path, figures: bool = True) -> None:
    path.write_text(markdown(result, figures))


def write_all(result: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    """results.json, results.md and (with `plots`) the PNGs; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md"]
    write_json(result, paths[0])
    # The plots and the markdown read the JSON form (inf as "inf"), as a reader of the file would.
    data = read_json(paths[0])
    write_markdown(data, paths[1], figures=plots)
    if plots:
        plot_ccdf(data, out_dir / CCDF_PNG)
        plot_p95_vs_rate(data, out_dir / P95_PNG)
        plot_speedup_vs_utilization(data, out_dir / SPEEDUP_PNG)
        paths += [out_dir / CCDF_PNG, out_dir / P95_PNG, out_dir / SPEEDUP_PNG]
    return paths
