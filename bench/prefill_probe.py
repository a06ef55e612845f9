"""Engine start time and prefill time of the embedded model on this machine.

    .venv/bin/python -m bench.prefill_probe [--tokens 1000 4000] [--repeats 3]
        [--dtype bfloat16] [--chunked-prefill-size 512] [--decode-tokens 32]

Prints one JSON object: engine start seconds and, per prompt length, the median time of a
prefill-only request (max_new_tokens=0) with an empty prefix cache. With two or more lengths
that each fit one prefill step (at most `--chunked-prefill-size`), also the least-squares line
through them, `step_fit`: a step's fixed cost (`fixed_s`), the cost of each token in it
(`per_token_ms`), and `break_even_tokens`, the step size at which its tokens cost as much as
its fixed part, and `speculative_chunk`, the chunk that `s2l profile` gives a profile whose
points these are (`sched.costmodel.chunk_for_step`: the size that takes twice the smallest).
That is what a cap on a step's speculative tokens (`speculative_chunk`) trades:
a smaller cap bounds how long a final context waits behind a speculative step, and spends a
larger share of each speculative step on the fixed part. `--decode-tokens N`: also the median
time of one decode step (a 16-token prompt generating N + 1 tokens, less one generating 1,
divided by N).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping

import orjson

from s2l_sglang.sched.costmodel import chunk_for_step


def step_fit(prefill_s: Mapping[int, float], step_tokens: int | None = None) -> dict | None:
    """The least-squares line `seconds = fixed_s + per_token * tokens` through the lengths that
    fit one prefill step (all of them if `step_tokens` is None); None with fewer than two."""
    points = sorted((n, s) for n, s in prefill_s.items() if step_tokens is None or n <= step_tokens)
    if len(points) < 2:
        return None
    per_token, fixed = statistics.linear_regression(*zip(*points, strict=True))
    return {
        "fixed_s": round(fixed, 4),
        "per_token_ms": round(per_token * 1000, 4),
        "break_even_tokens": round(fixed / per_token) if per_token > 0 else None,
        "speculative_chunk": chunk_for_step(points, 1, step_tokens),
        "lengths": [n for n, _ in points],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", help="the engine's dtype (default: the host's default)")
    parser.add_argument("--chunked-prefill-size", type=int, help="default: the host's default")
    parser.add_argument("--decode-tokens", type=int, default=0)
    args = parser.parse_args()

    from s2l_sglang.stream.engine import StreamEngine, flush_when_idle

    engine_args = {"log_level": "error"}
    if args.dtype:
        engine_args["dtype"] = args.dtype
    if args.chunked_prefill_size:
        engine_args["chunked_prefill_size"] = args.chunked_prefill_size
    t0 = time.perf_counter()
    eng = StreamEngine(**engine_args)
    result: dict = {"engine_start_s": round(time.perf_counter() - t0, 1), "prefill_s": {}}
    try:
        eng.generate(input_ids=[100] * 64, sampling_params={"max_new_tokens": 1})  # warm up
        tm = eng.engine.tokenizer_manager
        step_tokens = eng.engine.server_args.chunked_prefill_size
        result["engine"] = {
            "dtype": eng.engine.server_args.dtype,
            "chunked_prefill_size": step_tokens,
        }
        measured: dict[int, float] = {}
        for n in args.tokens:
            times = []
            for r in range(args.repeats):
                eng._call(flush_when_idle(tm))  # else a cached prefix would count
                ids = [(i * 7 + r) % 40000 + 100 for i in range(n)]
                start = time.perf_counter()
                eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})
                times.append(time.perf_counter() - start)
            measured[n] = statistics.median(times)
            result["prefill_s"][str(n)] = round(measured[n], 3)
        fit = step_fit(measured, step_tokens)
        if fit is not None:
            result["step_fit"] = fit
        if args.decode_tokens > 0:
            result["decode_step_s"] = round(_decode_step(eng, args.decode_tokens, args.repeats), 4)
    finally:
        eng.shutdown()
    print(orjson.dumps(result).decode())


def _decode_step(eng, tokens: int, repeats: int) -> float:
    """Median seconds of one decode step: (generating tokens + 1) less (generating 1)."""

    def timed(new: int, r: int) -> float:
        ids = [(i * 11 + r) % 40000 + 100 for i in range(16)]
        params = {"max_new_tokens": new, "ignore_eos": True}
        start = time.perf_counter()
        eng.generate(input_ids=ids, sampling_params=params)
        return time.perf_counter() - start

    one = statistics.median(timed(1, r) for r in range(repeats))
    many = statistics.median(timed(tokens + 1, r) for r in range(repeats))
    return (many - one) / tokens


if __name__ == "__main__":
    main()
