"""Result files of a benchmark: results.json, results.md (tables) and the PNG plots (`plots`).

`result` is the dict `runner.run_bench` builds: the header (preset, command, machine, date,
config), `runs` (one per workload x rate x mode, with its `summary`, its comparison with the
non-streaming run `vs_wait` and its query records) and the lower bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from bench.harness.metrics import groups, sorted_runs
from bench.harness.plots import plot_ccdf, plot_p95_vs_rate

CCDF_PNG = "ttft_ccdf.png"
P95_PNG = "ttft_p95_vs_rate.png"


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


# ---- markdown -------------------------------------------------------------------------------


def fmt_s(v: float | str | None) -> str:
    """Seconds, 3 significant digits; a failure (inf) shows as "fail"."""
    if v is None:
        return "-"
    v = float(v)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "fail"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def fmt_x(v: float | str | None) -> str:
    """A ratio as "2.31x"."""
    if v is None:
        return "-"
    v = float(v)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf"
    return f"{v:.2f}x"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("| " + " | ".join("---" if i == 0 else "---:" for i in range(len(header))) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _preempted(run: dict) -> str:
    sched = run.get("sched")
    if not sched:
        return "n/a"
    recompute, swap = sched.get("preemptions_recompute", 0), sched.get("preemptions_swap", 0)
    if not swap:
        return str(recompute)
    return f"{recompute + swap} ({recompute} recompute, {swap} swap)"


def _tokens(v: float | None) -> str:
    return "-" if v is None else f"{float(v):.0f}"


def run_rows(runs: list[dict]) -> list[list[str]]:
    rows = []
    for run in runs:
        s, vs = run["summary"], run.get("vs_wait") or {}
        speed = vs.get("ttft_speedup") or {}
        bound = s.get("ttft_over_bound") or {}
        tok = s["tokens"]
        rows.append(
            [
                f"`{run['mode']}`",
                fmt_s(run.get("probe_s")),
                f"{s['queries'] - s['failed']}/{s['queries']}",
                *(fmt_s(s["ttft_s"][k]) for k in ("p50", "p95", "p99")),
                *(fmt_x(speed.get(k)) for k in ("p50", "p95", "p99")),
                fmt_x(bound.get("p50")),
                fmt_x(bound.get("p95")),
                fmt_s(s["e2e_s"]["p50"]),
                fmt_s(s["completion_s"]),
                fmt_x(vs.get("completion_ratio")),
                _tokens(tok.get("unprefilled_at_finish_mean")),
                str(tok["prefilled"]),
                str(tok["invalidated"]),
                _preempted(run),
            ]
        )
    return rows


RUN_HEADER = [
    "mode",
    "probe s",
    "ok",
    "TTFT p50 s",
    "p95 s",
    "p99 s",
    "speedup p50",
    "p95",
    "p99",
    "TTFT/bound p50",
    "p95",
    "e2e p50 s",
    "completion s",
    "vs wait",
    "left at final chunk (mean tok)",
    "prefilled tok",
    "invalidated tok",
    "preemptions",
]


def markdown(result: dict, figures: bool = True) -> str:
    cfg, machine = result["config"], result["machine"]
    starts = ", ".join(f"{e['policy']} {e['start_s']:.0f} s" for e in result["engines"])
    lines = [f"# `s2l bench --preset {result['preset']}`", ""]
    lines += [result.get("description", ""), ""]
    lines += [
        f"- command: `{result['command']}`",
        f"- date: {result['date']}; wall time {result['wall_s']:.0f} s "
        f"(engine starts: {starts or 'none'})",
        f"- machine: {machine['nproc']} CPUs (`nproc`), {machine['cpu_model']}; "
        f"GPU: {machine.get('gpu') or 'none'}; load average at start {machine['load_start']}, "
        f"at end {machine['load_end']} (other jobs may share the machine: CPU pressure is the "
        "share of time runnable tasks waited for a core)",
        f"- code: {machine.get('git', '?')}; SGLang {machine.get('sglang', '?')}, "
        f"torch {machine.get('torch', '?')}",
        f"- model: {cfg['model']}; engine arguments {cfg['engine_kwargs'] or '{}'}; "
        f"{'in-process engine' if cfg['target'] == 'engine' else 'HTTP server ' + cfg['target']}",
        "- queries: "
        + ", ".join(f"{w['name']} {w['queries']} at {w['rates']} QPS" for w in cfg["workloads"])
        + f" (seeded sample, seed {cfg['seed']}); contexts cut to "
        f"{cfg['max_context_tokens'] or 'no'} tokens; chunk delays x{cfg['delay_scale']:g}; "
        f"{cfg['max_new_tokens']} output token(s)",
        "- TTFT: from the final chunk's scheduled arrival (with the question) to the first "
        "output token, measured by the client; e2e: from the query's arrival to its last token; "
        "completion: first arrival to the last query's last token.",
        f"- lower bound: {result['lower_bound']['method']}"
        + _bound_probes(result["lower_bound"].get("probe_s") or {}),
        f"- preemptions: {result['sched_note']}",
        "",
        "Speedup = the non-streaming (`wait`) TTFT / this mode's TTFT at the same percentile "
        "(>1 is faster); completion `vs wait` = this completion time / wait's (<= 1.02 is the "
        "target). `fail` = a query that never got its first token (timeout or error). "
        "`left at final chunk`: prompt tokens still to prefill when the final chunk arrived; "
        "`prefilled`: prompt tokens the engine computed for all the run's requests (warming "
        "and update-mode rollbacks recompute); `invalidated`: held KV dropped by rollbacks. "
        f"`probe`: seconds the idle engine took, right before the replay, to prefill "
        f"{cfg['max_context_tokens'] or 1000} tokens from an empty cache: the machine's speed "
        "at that time (rows whose probes differ much were measured on a differently loaded "
        "machine and do not compare well).",
        "",
    ]
    for (workload, rate), runs in groups(result["runs"]).items():
        trace_mode = runs[0]["trace_mode"]
        lines += [f"## {workload} ({trace_mode} mode), {rate:g} QPS", ""]
        lines += _table(RUN_HEADER, run_rows(runs))
        note = probe_note(runs)
        if note:
            lines += ["", note]
        errors = [(r["mode"], e) for r in runs for e in r["summary"]["errors"]]
        if errors:
            lines += ["", "Errors: " + "; ".join(f"`{m}`: {e}" for m, e in errors)]
        lines.append("")
    lines += ["## Closing note", ""]
    lines += closing_note(result)
    if figures:
        lines += ["", f"![TTFT CCDF]({CCDF_PNG})", "", f"![p95 TTFT against rate]({P95_PNG})"]
    return "\n".join(lines) + "\n"


def _bound_probes(probes: dict) -> str:
    if not probes:
        return ""
    return "; speed probe then: " + ", ".join(f"{w} {fmt_s(v)} s" for w, v in probes.items())


PROBE_SPREAD = 1.5


def probe_note(runs: list[dict]) -> str | None:
    """A warning when the machine's speed differed much between the replays of one table."""
    probes = [float(r["probe_s"]) for r in runs if r.get("probe_s") not in (None, "inf")]
    if len(probes) < 2 or max(probes) <= PROBE_SPREAD * min(probes):
        return None
    return (
        f"**Warning:** the speed probe ranged from {min(probes):.2f} s to {max(probes):.2f} s "
        "between these replays: other jobs loaded the machine unevenly, so rows with very "
        "different probes are not comparable."
    )


def closing_note(result: dict) -> list[str]:
    """TTFT speedup over non-streaming per mode and workload, and the completion-time ratio."""
    header = ["workload", "QPS", "mode", "TTFT speedup p50 / p95 / p99", "completion vs wait"]
    rows = []
    for run in sorted_runs(result["runs"]):
        vs = run.get("vs_wait")
        if not vs or run["mode"] == "wait":
            continue
        sp = vs["ttft_speedup"]
        rows.append(
            [
                run["workload"],
                f"{run['rate']:g}",
                f"`{run['mode']}`",
                " / ".join(fmt_x(sp.get(k)) for k in ("p50", "p95", "p99")),
                fmt_x(vs.get("completion_ratio")),
            ]
        )
    return _table(header, rows) if rows else ["(no non-streaming baseline in this run)"]


def write_markdown(result: dict, path: Path, figures: bool = True) -> None:
    path.write_text(markdown(result, figures))


def write_all(result: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    """results.json, results.md and (with `plots`) the two PNGs; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md"]
    write_json(result, paths[0])
    # The plots and the markdown read the JSON form (inf as "inf"), as a reader of the file would.
    data = read_json(paths[0])
    write_markdown(data, paths[1], figures=plots)
    if plots:
        plot_ccdf(data, out_dir / CCDF_PNG)
        plot_p95_vs_rate(data, out_dir / P95_PNG)
        paths += [out_dir / CCDF_PNG, out_dir / P95_PNG]
    return paths
