"""Engine start time and prefill time of the embedded model on this machine.

    .venv/bin/python -m bench.prefill_probe [--tokens 1000 4000] [--repeats 3]

Prints one JSON object: engine start seconds and, per prompt length, the median time of a
prefill-only request (max_new_tokens=0) with an empty prefix cache.
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from s2l_sglang.stream.engine import StreamEngine

    t0 = time.perf_counter()
    eng = StreamEngine(log_level="error")
    result: dict = {"engine_start_s": round(time.perf_counter() - t0, 1), "prefill_s": {}}
    try:
        eng.generate(input_ids=[100] * 64, sampling_params={"max_new_tokens": 1})  # warm up
        tm = eng.engine.tokenizer_manager
        for n in args.tokens:
            times = []
            for r in range(args.repeats):
                eng._call(tm.flush_cache())
                ids = [(i * 7 + r) % 40000 + 100 for i in range(n)]
                start = time.perf_counter()
                eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 0})
                times.append(time.perf_counter() - start)
            result["prefill_s"][str(n)] = round(statistics.median(times), 3)
    finally:
        eng.shutdown()
    print(orjson.dumps(result).decode())


if __name__ == "__main__":
    main()
