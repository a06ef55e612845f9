"""`s2l demo`: the README's main job."""

from __future__ import annotations

import argparse
import time

import orjson

QUESTION = "What is the capital of France?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--max-new-tokens", type=int, default=24)


def main(args: argparse.Namespace) -> int:
    import sglang as sgl

    from s2l_sglang.defaults import engine_kwargs

    t0 = time.perf_counter()
    engine = sgl.Engine(**engine_kwargs(log_level="error"))
    started = time.perf_counter() - t0
    try:
        tokenizer = engine.tokenizer_manager.tokenizer
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
        )
        out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": args.max_new_tokens})
    finally:
        engine.shutdown()
    result = {
        "question": QUESTION,
        "answer": out["text"],
        "engine_start_s": round(started, 2),
        "e2e_latency_s": round(out["meta_info"]["e2e_latency"], 3),
    }
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        print(f"engine started in {result['engine_start_s']} s")
        print(f"Q: {QUESTION}\nA: {result['answer']}  ({result['e2e_latency_s']} s)")
    return 0
