"""`s2l bench` (also `python -m bench.cli`): replay streaming traces at Poisson rates and compare
TTFT over non-streaming, interleaved on one engine, with confidence intervals.

    s2l bench --preset cpu-quick                 # smoke run, ~6 min on 2 cores
    s2l bench --preset cpu-full                  # tails: 100 queries per workload, ~55 min
    s2l bench --preset paper-regime              # the paper's shapes and load, ~95 min
    s2l bench --preset cpu-quick --traces my.jsonl artifact/query_3.csv   # any trace file
    s2l bench --preset cpu-quick --url http://127.0.0.1:30000   # a running `s2l serve`
    s2l bench --preset cpu-full --estimate       # how long it would take, without running

Modes: `wait` (non-streaming), `warming` (SGLang prefix warming), `sessions` (SGLang streaming
sessions, append traces only) and `stream` (ours, once per stream policy). Writes results.json,
results.md and PNG plots to --out (default bench/results/<preset>/) and prints one summary
line. How to run and read it: bench/README.md; the committed results: bench/results/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 0.5,1, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"rates must be > 0, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _engine_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    import orjson

    try:
        parsed: Any = orjson.loads(value)
    except orjson.JSONDecodeError:
        parsed = value
    return key.replace("-", "_"), parsed


def build_parser() -> argparse.ArgumentParser:
    """The options of `s2l bench` (light imports only: `s2l` builds every parser at start)."""
    from bench.harness.presets import ALL_MODES, WORKLOAD_FILES, preset_names
    from s2l_sglang.sched.policy import policy_names

    parser = argparse.ArgumentParser(prog="s2l bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--preset", default="cpu-quick", choices=preset_names(), help="(default: cpu-quick)"
    )
    parser.add_argument("--list-presets", action="store_true", help="describe the presets, exit")
    parser.add_argument("--estimate", action="store_true", help="print the time estimate, exit")
    parser.add_argument("--out", type=Path, help="output folder (default bench/results/PRESET)")
    target = parser.add_argument_group("target (default: an in-process engine)")
    target.add_argument("--url", help="a running `s2l serve`")
    target.add_argument("--api-key", help="the server's --api-key")
    target.add_argument("--tokenizer", help="tokenizer path for --url (default: the model's)")
    over = parser.add_argument_group("overrides of the preset")
    over.add_argument(
        "--traces",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="replay these trace files instead of the shipped workloads: normalized .jsonl"
        "[.xz|.gz], the artifact's crawler or ANN .csv, or an artifact folder",
    )
    over.add_argument(
        "--workloads", type=_names, help=f"comma-separated, from {sorted(WORKLOAD_FILES)}"
    )
    over.add_argument("--queries", type=int, help="queries per workload (seeded sample)")
    over.add_argument(
        "--rates", type=_floats, help="arrival rates in QPS, e.g. 0.25,0.5 (paper-regime: the "
        "paper's QPS, mapped at equal utilization)",
    )  # fmt: skip
    over.add_argument("--policies", type=_names, help=f"stream policies, from {policy_names()}")
    over.add_argument(
        "--modes", type=_names, help=f"modes, from {list(ALL_MODES)} and stream-nopub (the "
        "stream mode with publish_at_close switched off for its replays)",
    )  # fmt: skip
    over.add_argument("--repeats", type=int, help="replays of each mode, interleaved")
    over.add_argument("--max-context-tokens", type=int, help="context token budget (0: none)")
    over.add_argument("--delay-scale", type=float, help="multiply chunk times (x10: pressure)")
    over.add_argument("--max-new-tokens", type=int, help="output tokens (default 1)")
    over.add_argument("--seed", type=int)
    over.add_argument("--model-path", help="model (default: the preset's)")
    over.add_argument(
        "--engine-arg",
        type=_engine_arg,
        action="append",
        metavar="KEY=VALUE",
        help="an sgl.Engine argument (JSON value), repeatable, e.g. max_total_tokens=4096",
    )
    over.add_argument("--drain-timeout", type=float, help="seconds after the last final chunk")
    over.add_argument(
        "--lower-bound",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure the per-query TTFT lower bound (default: the preset's)",
    )
    over.add_argument("--bound-repeats", type=int, help="bound samples per query (default 3)")
    over.add_argument("--probe-tokens", type=int, help="speed probe size in tokens")
    over.add_argument("--drift-margin", type=float, help="probe deviation flagged (0.25: 25%%)")
    parser.add_argument("--no-plots", action="store_true", help="no PNG plots")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def preset_from_args(args: argparse.Namespace):
    """The chosen preset with the command line's overrides applied (ValueError for a bad name,
    `TraceFileError` for a trace file that does not read)."""
    from bench.harness.modes import mode_names
    from bench.harness.presets import WORKLOAD_FILES, WorkloadSpec, get_preset
    from bench.tracefiles import read_any, workload_name
    from s2l_sglang.sched.policy import get_policy

    preset = get_preset(args.preset)
    changes: dict[str, Any] = {}
    workloads = preset.workloads
    if args.traces:
        names: list[str] = []
        for path in args.traces:
            read_any(path)  # a malformed file fails here, before any engine starts
            names.append(workload_name(path, names))
        first = preset.workloads[0]
        workloads = tuple(
            WorkloadSpec(n, first.rates, first.queries, file=str(p))
            for n, p in zip(names, args.traces, strict=True)
        )
    elif args.workloads:
        unknown = set(args.workloads) - set(WORKLOAD_FILES)
        if unknown:
            raise ValueError(
                f"unknown workload(s) {sorted(unknown)}; known: {sorted(WORKLOAD_FILES)}"
            )
        kept = tuple(w for w in workloads if w.name in args.workloads)
        missing = [n for n in args.workloads if n not in {w.name for w in kept}]
        workloads = kept + tuple(
            dataclasses.replace(preset.workloads[0], name=n, modes=None) for n in missing
        )
    if args.queries is not None:
        workloads = tuple(dataclasses.replace(w, queries=args.queries) for w in workloads)
    if args.rates:
        workloads = tuple(dataclasses.replace(w, rates=args.rates) for w in workloads)
    changes["workloads"] = workloads
    if args.policies:
        for p in args.policies:
            get_policy(p)
        changes["policies"] = args.policies
    if args.modes:
        unknown = set(args.modes) - set(mode_names())
        if unknown:
            raise ValueError(f"unknown mode(s) {sorted(unknown)}; known: {mode_names()}")
        changes["modes"] = args.modes
        changes["workloads"] = tuple(dataclasses.replace(w, modes=None) for w in workloads)
    if args.max_context_tokens is not None:
        changes["max_context_tokens"] = args.max_context_tokens or None
    for name in ("delay_scale", "max_new_tokens", "seed", "model_path", "repeats"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    for name, field in (("drain_timeout", "drain_timeout_s"), ("lower_bound", "lower_bound"),
                        ("bound_repeats", "bound_repeats"), ("probe_tokens", "probe_tokens"),
                        ("drift_margin", "drift_margin")):  # fmt: skip
        if getattr(args, name) is not None:
            changes[field] = getattr(args, name)
    if args.engine_arg:
        changes["engine_kwargs"] = {**preset.engine_kwargs, **dict(args.engine_arg)}
    for name in ("repeats", "bound_repeats"):
        if changes.get(name, 1) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    return dataclasses.replace(preset, **changes)


def _list_presets() -> None:
    from bench.harness.budget import estimate
    from bench.harness.presets import get_preset, preset_names

    for name in preset_names():
        p = get_preset(name)
        print(f"{name}: {p.description}")
        for w in p.workloads:
            modes = f" (modes {', '.join(w.modes)})" if w.modes else ""
            print(f"    {w.name}: {w.queries or 'all'} queries at {w.rates} QPS{modes}")
        est = estimate(p)
        print(
            f"    policies {', '.join(p.policies)}; modes {', '.join(p.modes)}; repeats "
            f"{p.repeats}; context budget {p.max_context_tokens or 'none'}; delays "
            f"x{p.delay_scale:g}; engine {p.engine_kwargs or '{}'}; model "
            f"{p.model_path or 'embedded'}; budget {_minutes(p.budget_s)}"
            + (f", estimated {_minutes(est['total_s'])}" if est else "")
        )
        if p.notes:
            print(f"    {p.notes}")


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.0f} min"


def summary_line(result: dict, out: Path) -> str:
    """One line: per workload, the best p50 speedup of our streams with its interval, then the
    run's faults, drift flags and wall time."""
    from bench.harness.report import fmt_speedup, fmt_x

    parts = []
    entries = [c for c in result.get("comparisons", []) if c.get("speedup")]
    for workload in dict.fromkeys(c["workload"] for c in entries):
        ours = [c for c in entries if c["workload"] == workload and c["mode"].startswith("stream")]
        if not ours:
            continue
        best = max(ours, key=lambda c: _num((c["speedup"]["p50"] or {}).get("value")))
        sp = best["speedup"]
        parts.append(
            f"{workload} {best['mode']}@{best['rate']:.3g}: TTFT p50 {fmt_speedup(sp['p50'])} "
            f"p95 {fmt_speedup(sp['p95'])} vs wait, completion {fmt_x(best['completion_ratio'])}"
        )
    probe = result.get("probe") or {}
    return (
        f"s2l bench {result['preset']}: "
        + ("; ".join(parts) or "no comparison")
        + f"; {result.get('bound_faults', 0)} bound faults, {probe.get('flagged', 0)}/"
        f"{len(result['runs'])} replays drift-flagged; {result['wall_s']:.0f} s; results in {out}"
    )


def _num(v: Any) -> float:
    return -1.0 if v is None or v == "inf" else float(v)


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (the arguments after `s2l bench`), run, write the results; the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.list_presets:
        _list_presets()
        return 0
    from bench.traces import TraceFileError

    try:
        preset = preset_from_args(args)
    except (TraceFileError, ValueError) as exc:
        print(f"s2l bench: error: {exc}", file=sys.stderr)
        return 2
    if args.estimate:
        from bench.harness.budget import estimate

        est = estimate(preset)
        if est is None:
            print(f"{preset.name}: no estimate (a GPU preset)")
        else:
            print(
                f"{preset.name}: about {_minutes(est['total_s'])} ({est['replays']} replays "
                f"{_minutes(est['replays_s'])}, bound samples {_minutes(est['bounds_s'])}; "
                f"budget {_minutes(preset.budget_s)})"
            )
        return 0
    from bench.harness.presets import REPO_ROOT
    from bench.harness.report import write_all
    from bench.harness.runner import run_bench

    out = Path(args.out or (REPO_ROOT / "bench" / "results" / preset.name))
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "partial.jsonl"  # each replay's records as it ends; removed on success
    checkpoint.unlink(missing_ok=True)
    result = run_bench(
        preset,
        url=args.url,
        api_key=args.api_key,
        tokenizer_path=args.tokenizer,
        command="s2l bench " + shlex.join(argv),
        progress=not args.quiet,
        checkpoint=checkpoint,
    )
    write_all(result, out, plots=not args.no_plots)
    checkpoint.unlink(missing_ok=True)
    print(summary_line(result, out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
