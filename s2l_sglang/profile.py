"""`s2l profile`: measure the preemption cost model on this hardware and save it.

- recompute(n): the time to prefill n uncached tokens (a prefill-only SGLang request,
  `max_new_tokens=0`, whose first token no earlier request had), end to end on a running engine;
- swap(n): swap-out plus swap-in of n tokens with SGLang's own KV copy primitives
  (`get_cpu_copy` / `load_cpu_copy`, what `radix_ext.swap` runs) on a KV pool of the model's
  shape (layers, KV heads, head size, dtype) on the engine's device.

Token counts go from 16 to the context length (doubling, plus the context length itself); each
is measured `repeats` times and the fastest kept (other processes only add time); the
recompute curve is made non-decreasing. The profile records the engine's prefill step
(`chunked_prefill_size`): its recompute points up to that size each took one step, and a server
or engine started without `--stream-speculative-chunk` takes its `speculative_chunk` from them
(`CostModel.speculative_chunk`, `config.with_measured_chunk`). The profile is saved as JSON keyed by
(model, device, dtype, tp, page size) into the user's profile directory; the scheduler loads the
matching one (`sched.costmodel.find_cost_model`), searching the user's directory, then the profiles shipped
with the package.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from s2l_sglang.sched.costmodel import (
    CostModel,
    ProfileStore,
    key_of_server_args,
    user_profile_dir,
)


def token_counts(context_len: int, start: int = 16) -> list[int]:
    """16, 32, 64, ... below the context length, then the context length."""
    counts, n = [], start
    while n < context_len:
        counts.append(n)
        n *= 2
    return counts + [context_len]


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of `repeats` runs: other processes on the host only ever add time."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_swap(
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype: Any,
    device: str,
    counts: list[int],
    repeats: int,
) -> list[tuple[int, float]]:
    """swap-out + swap-in seconds per token count, on a real SGLang KV pool of that shape."""
    import torch
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    size = max(counts)
    pool = MHATokenToKVPool(size + 1, 1, dtype, kv_heads, head_dim, layers, device, False)
    alloc = TokenToKVPoolAllocator(size + 1, dtype, device, pool, need_sort=False)
    points = []
    for n in counts:
        idx = alloc.alloc(n)

        def round_trip(idx=idx) -> None:
            kv_cpu = alloc.get_cpu_copy(idx.to(torch.int64))
            alloc.load_cpu_copy(kv_cpu, idx)

        points.append((n, _best_time(round_trip, repeats)))
        alloc.free(idx)
    return points


def measure_recompute(
    engine: Any, counts: list[int], repeats: int, log: Callable[[str], None] = lambda s: None
) -> list[tuple[int, float]]:
    """Prefill seconds per token count on `engine` (a `StreamEngine`): each request starts with
    its own first token, so nothing is matched in the prefix cache (no flush needed; SGLang's
    flush re-initialises the pool and slows the next request). Each point is logged as measured."""
    points = []
    vocab = engine.tokenizer.vocab_size
    for n in counts:

        def prefill(n: int = n) -> None:
            first = next(_FIRST_TOKENS) % vocab
            ids = [first] + [(1000 + 7 * i) % vocab for i in range(n - 1)]
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})

        points.append((n, _best_time(prefill, repeats)))
        log(f"  recompute {n:>6} tokens: {points[-1][1] * 1e3:9.2f} ms")
    return _nondecreasing(points)


def _nondecreasing(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Prefill time cannot fall as tokens grow: a dip is measurement noise, raised to the
    previous point."""
    out, top = [], 0.0
    for n, t in sorted(points):
        top = max(top, t)
        out.append((n, top))
    return out


_FIRST_TOKENS = itertools.count(100)


def run_profile(
    engine_kwargs: dict[str, Any],
    repeats: int = 3,
    max_tokens: int | None = None,
    out_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> tuple[CostModel, Path]:
    """Start an engine, measure both curves, save the profile; returns it and its path."""
    import torch

    from s2l_sglang.stream.engine import StreamEngine

    log("starting the engine to profile ...")
    engine = StreamEngine(idle_timeout=None, log_level="error", **engine_kwargs)
    try:
        args = engine.engine.server_args
        cfg = engine.engine.tokenizer_manager.model_config
        dtype = str(cfg.dtype).replace("torch.", "")
        key = key_of_server_args(args, dtype)
        context = int(engine.engine.tokenizer_manager.context_len)
        # SGLang accepts inputs strictly shorter than its max_req_input_len.
        limit = (getattr(engine.engine.tokenizer_manager, "max_req_input_len", None) or context) - 1
        counts = token_counts(min(limit, max_tokens or limit))
        log(f"profiling {key} at {counts} tokens, {repeats} repeats each")
        recompute = measure_recompute(engine, counts, repeats, log)
        swap = measure_swap(
            layers=cfg.num_hidden_layers,
            kv_heads=cfg.get_num_kv_heads(args.tp_size),
            head_dim=cfg.head_dim,
            dtype=getattr(torch, dtype),
            device=args.device or "cpu",
            counts=counts,
            repeats=repeats,
        )
        for n, t in swap:
            log(f"  swap      {n:>6} tokens: {t * 1e3:9.2f} ms")
        step_tokens = args.chunked_prefill_size
    finally:
        engine.shutdown()
    model = CostModel.fit(recompute, swap, key, step_tokens)
    log(f"  speculative_chunk {model.speculative_chunk()}")
    path = ProfileStore(out_dir or user_profile_dir()).save(model)
    _add_provenance(path, repeats)
    return model, path


def _add_provenance(path: Path, repeats: int) -> None:
    """Record when and where the profile was measured (ignored when loading)."""
    import json
    import platform
    from datetime import UTC, datetime

    data = json.loads(path.read_text())
    data["measured"] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs, {_cpu_name() or platform.processor() or platform.machine()}",
        "load_average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        "repeats": repeats,
        "command": "s2l profile",
    }
    path.write_text(json.dumps(data, indent=1))


def _cpu_name() -> str | None:
    """The CPU's model name (Linux `/proc/cpuinfo`), or None: the same device name ("cpu")
    covers CPUs whose speeds differ many times over."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def ensure_profile(argv: list[str]) -> None:
    """Before serving with `--preemption auto`: profile the setup if no saved profile matches
    (the scheduler loads it; without one it preempts by recompute)."""
    import sys

    from s2l_sglang.procs import option_value
    from s2l_sglang.sched.costmodel import find_cost_model, profile_key

    dtype = option_value(argv, "--dtype", "auto")
    if dtype == "auto":  # resolved from the model config in the scheduler only
        return
    model_path = option_value(argv, "--model-path") or ""
    device = option_value(argv, "--device", "cpu")
    tp = int(option_value(argv, "--tp-size") or option_value(argv, "--tp") or 1)
    page = int(option_value(argv, "--page-size") or 1)
    key = profile_key(model_path, device, dtype, tp, page)
    if find_cost_model(key) is not None:
        return
    print(f"no preemption cost profile for {key}: measuring one now (s2l profile)", file=sys.stderr)
    kwargs = dict(model_path=model_path, dtype=dtype, tp_size=tp, page_size=page, device=device)
    _, path = run_profile(kwargs, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(f"saved {path}", file=sys.stderr)


def ensure_profile_before_instances(user_argv: list[str]) -> None:
    """`ensure_profile` once for a set of `s2l serve` instances started with `user_argv` (a
    usage error exits here, before any starts), so that they do not all measure the same one
    at the same time."""
    from s2l_sglang.config import split_argv
    from s2l_sglang.defaults import server_argv

    config, sglang_args = split_argv(user_argv)
    if config.preemption == "auto":
        ensure_profile(server_argv(sglang_args))
