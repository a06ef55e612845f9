"""`s2l bench`: replay streaming traces at Poisson rates and compare TTFT four ways.

    s2l bench --preset cpu-quick                 # embedded model, in process, ~10 min on 2 cores
    s2l bench --preset memory-pressure           # small KV pool, chunk delays x10
    s2l bench --preset gpu                       # Llama-3.1-8B-Instruct on an H100/H200
    s2l bench --preset cpu-quick --url http://127.0.0.1:30000 --policies fcfs   # a running server

Modes: `wait` (non-streaming), `warming` (SGLang prefix warming), `sessions` (SGLang streaming
sessions, append traces only) and `stream` (ours, once per stream policy: one engine start
each). Writes results.json, results.md and two PNG plots to --out (default
bench/results/<preset>/) and prints one summary line. The harness lives in `bench.harness`.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Light imports only: `s2l` builds every subcommand's parser at start.
    from bench.harness.presets import ALL_MODES, WORKLOAD_FILES, preset_names
    from s2l_sglang.sched.policy import policy_names

    parser.add_argument(
        "--preset", default="cpu-quick", choices=preset_names(), help="(default: cpu-quick)"
    )
    parser.add_argument("--list-presets", action="store_true", help="describe the presets, exit")
    parser.add_argument("--out", type=Path, help="output folder (default bench/results/PRESET)")
    target = parser.add_argument_group("target (default: an in-process engine per policy)")
    target.add_argument("--url", help="a running `s2l serve` (its --stream-policy: --policies)")
    target.add_argument("--api-key", help="the server's --api-key")
    target.add_argument("--tokenizer", help="tokenizer path for --url (default: the model's)")
    over = parser.add_argument_group("overrides of the preset")
    over.add_argument(
        "--workloads", type=_names, help=f"comma-separated, from {sorted(WORKLOAD_FILES)}"
    )
    over.add_argument("--queries", type=int, help="queries per workload (seeded sample)")
    over.add_argument("--rates", type=_floats, help="arrival rates in QPS, e.g. 0.25,0.5")
    over.add_argument("--policies", type=_names, help=f"stream policies, from {policy_names()}")
    over.add_argument("--modes", type=_names, help=f"modes, from {list(ALL_MODES)}")
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
    over.add_argument("--no-lower-bound", action="store_true", help="skip the bound measurement")
    parser.add_argument("--no-plots", action="store_true", help="no PNG plots")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def preset_from_args(args: argparse.Namespace):
    """The chosen preset with the command line's overrides applied."""
    from bench.harness.modes import mode_names
    from bench.harness.presets import WORKLOAD_FILES, get_preset
    from s2l_sglang.sched.policy import get_policy

    preset = get_preset(args.preset)
    changes: dict[str, Any] = {}
    workloads = preset.workloads
    if args.workloads:
        unknown = set(args.workloads) - set(WORKLOAD_FILES)
        if unknown:
            raise SystemExit(
                f"unknown workload(s) {sorted(unknown)}; known: {sorted(WORKLOAD_FILES)}"
            )
        workloads = tuple(w for w in workloads if w.name in args.workloads)
        missing = [n for n in args.workloads if n not in {w.name for w in workloads}]
        workloads += tuple(dataclasses.replace(preset.workloads[0], name=n) for n in missing)
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
            raise SystemExit(f"unknown mode(s) {sorted(unknown)}; known: {mode_names()}")
        changes["modes"] = args.modes
    if args.max_context_tokens is not None:
        changes["max_context_tokens"] = args.max_context_tokens or None
    for field in ("delay_scale", "max_new_tokens", "seed", "model_path"):
        if getattr(args, field) is not None:
            changes[field] = getattr(args, field)
    if args.drain_timeout is not None:
        changes["drain_timeout_s"] = args.drain_timeout
    if args.engine_arg:
        changes["engine_kwargs"] = {**preset.engine_kwargs, **dict(args.engine_arg)}
    if args.no_lower_bound:
        changes["lower_bound"] = False
    return dataclasses.replace(preset, **changes)


def _list_presets() -> None:
    from bench.harness.presets import get_preset, preset_names

    for name in preset_names():
        p = get_preset(name)
        print(f"{name}: {p.description}")
        for w in p.workloads:
            print(
                f"    {w.name}: {w.queries or 'all'} queries at {', '.join(map(str, w.rates))} QPS"
            )
        print(
            f"    policies {', '.join(p.policies)}; modes {', '.join(p.modes)}; context budget "
            f"{p.max_context_tokens or 'none'}; delays x{p.delay_scale:g}; "
            f"engine {p.engine_kwargs or '{}'}; model {p.model_path or 'embedded'}"
        )
        if p.notes:
            print(f"    {p.notes}")


def summary_line(result: dict, out: Path) -> str:
    """One line: the best streaming speedup per workload and the completion ratio."""
    parts = []
    for workload in dict.fromkeys(r["workload"] for r in result["runs"]):
        runs = [r for r in result["runs"] if r["workload"] == workload and r.get("vs_wait")]
        ours = [r for r in runs if r["mode"].startswith("stream")]
        if not ours:
            continue
        best = max(ours, key=lambda r: _num(r["vs_wait"]["ttft_speedup"]["p50"]))
        sp, cr = best["vs_wait"]["ttft_speedup"], best["vs_wait"]["completion_ratio"]
        parts.append(
            f"{workload} {best['mode']}@{best['rate']:g}: TTFT p50 {_x(sp['p50'])} p95 "
            f"{_x(sp['p95'])} vs wait, completion {_x(cr)}"
        )
    return (
        f"s2l bench {result['preset']}: "
        + ("; ".join(parts) or "no comparison")
        + f"; {result['wall_s']:.0f} s; results in {out}"
    )


def _num(v: Any) -> float:
    return -1.0 if v is None else float(v)


def _x(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}x"


def main(args: argparse.Namespace) -> int:
    if args.list_presets:
        _list_presets()
        return 0
    from bench.harness.presets import REPO_ROOT
    from bench.harness.report import write_all
    from bench.harness.runner import run_bench

    preset = preset_from_args(args)
    out = Path(args.out or (REPO_ROOT / "bench" / "results" / preset.name))
    command = "s2l bench " + shlex.join(getattr(args, "argv", None) or sys.argv[2:])
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "partial.jsonl"  # each replay's records as it ends; removed on success
    checkpoint.unlink(missing_ok=True)
    result = run_bench(
        preset,
        url=args.url,
        api_key=args.api_key,
        tokenizer_path=args.tokenizer,
        command=command,
        progress=not args.quiet,
        checkpoint=checkpoint,
    )
    write_all(result, out, plots=not args.no_plots)
    checkpoint.unlink(missing_ok=True)
    print(summary_line(result, out), flush=True)
    return 0


if __name__ == "__main__":  # before `s2l bench` is wired: python -m s2l_sglang.cli_bench ...
    _parser = argparse.ArgumentParser(prog="s2l bench", description=__doc__.split("\n")[0])
    add_arguments(_parser)
    _args = _parser.parse_args()
    _args.argv = sys.argv[1:]
    sys.exit(main(_args))
