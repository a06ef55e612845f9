"""`s2l demo`: streaming TTFT against what an SGLang user can do today, on the embedded model.

A crawler-shaped stream (by default 12 chunks of about 250 tokens, 1.5 s apart, then the
question) is replayed in real time four ways on one engine, with the prefix cache flushed between:

- wait:     wait for the whole context, then one plain SGLang request;
- warming:  plain SGLang "prefix warming": after each chunk, resend the text so far with
            max_new_tokens=0 (the radix cache keeps it), then the full request;
- stream:   our stream (open, append per chunk, finish with the question);
- bound:    the lower bound: the context up to the last chunk already cached, then the full
            request (prefill of the last chunk's tokens plus one decode step).

TTFT counts from the moment the last chunk arrives to the first output token. The context is
stdlib documentation (always present, deterministic per Python version).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import time
from typing import Any

import orjson

QUESTION = (
    "\n\nQuestion: Which module in the text above handles JSON, and what does it do?\nAnswer:"
)
SOURCES = ["json", "asyncio", "collections", "itertools", "functools", "pathlib", "re", "typing"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--chunks", type=int, default=12, help="number of chunks (default 12)")
    parser.add_argument("--chunk-tokens", type=int, default=250, help="tokens per chunk")
    parser.add_argument("--gap", type=float, default=1.5, help="seconds between chunks")
    parser.add_argument("--max-new-tokens", type=int, default=32)


def build_chunks(tokenizer: Any, n: int, chunk_tokens: int) -> list[str]:
    """`n` chunks of about `chunk_tokens` tokens of stdlib documentation text."""
    import importlib

    text = "\n\n".join(inspect.getdoc(importlib.import_module(m)) or "" for m in SOURCES)
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < n * chunk_tokens:
        ids = ids + ids
    return [tokenizer.decode(ids[i * chunk_tokens : (i + 1) * chunk_tokens]) for i in range(n)]


async def _timed_request(tm: Any, input_ids: list[int], params: dict) -> tuple[float, dict]:
    """A plain SGLang request; returns (seconds to the first output token, final output)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    start = time.perf_counter()
    first = None
    out: dict = {}
    async for out in tm.generate_request(
        GenerateReqInput(input_ids=input_ids, sampling_params=params, stream=True), None
    ):
        if first is None and out.get("output_ids"):
            first = time.perf_counter() - start
    return (first if first is not None else time.perf_counter() - start), out


async def _arrivals(chunks: list[str], gap: float):
    """Yield (index, chunk) in real time, `gap` seconds apart (the first at once)."""
    start = time.perf_counter()
    for i, chunk in enumerate(chunks):
        delay = start + i * gap - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        yield i, chunk


async def run_scenarios(engine: Any, chunks: list[str], gap: float, params: dict) -> dict:
    """The four scenarios on `engine`, each from an empty prefix cache: name -> (TTFT s,
    final output). A flush SGLang refused would leave the previous one's prompt cached
    (prefix warming once showed 0.10 s against a lower bound of 0.64 s)."""
    from s2l_sglang.stream.engine import flush_when_idle

    tm = engine.engine.tokenizer_manager
    encode = engine.streams._tokenize
    full_ids = encode("".join(chunks) + QUESTION)
    results: dict[str, Any] = {}

    await flush_when_idle(tm)
    results["wait"] = await _timed_request(tm, full_ids, params)  # after all chunks arrived

    await flush_when_idle(tm)
    warmers = []
    async for i, _ in _arrivals(chunks, gap):
        if i < len(chunks) - 1:
            so_far = encode("".join(chunks[: i + 1]))
            warmers.append(asyncio.ensure_future(_timed_request(tm, so_far, {"max_new_tokens": 0})))
    results["warming"] = await _timed_request(tm, full_ids, params)
    await asyncio.gather(*warmers)

    await flush_when_idle(tm)
    sid = f"demo-{time.monotonic_ns()}"
    await engine.streams.open(sid, params)
    async for _i, chunk in _arrivals(chunks[:-1], gap):
        await engine.streams.append(sid, chunk)
    await asyncio.sleep(gap)
    final = await engine._collect(engine.streams.finish(sid, chunks[-1] + QUESTION))
    results["stream"] = (final["meta_info"]["stream"]["ttft_s"], final)

    await flush_when_idle(tm)
    await _timed_request(tm, encode("".join(chunks[:-1])), {"max_new_tokens": 0})
    results["bound"] = await _timed_request(tm, full_ids, params)
    return results


def main(args: argparse.Namespace) -> int:
    from s2l_sglang.stream.engine import StreamEngine

    t0 = time.perf_counter()
    engine = StreamEngine(log_level="error")
    started = time.perf_counter() - t0
    try:
        engine.generate("warm up", {"max_new_tokens": 4})
        chunks = build_chunks(engine.tokenizer, args.chunks, args.chunk_tokens)
        params = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        if not args.json:
            print(
                f"engine started in {started:.1f} s; replaying {args.chunks} chunks of "
                f"~{args.chunk_tokens} tokens, {args.gap} s apart, four ways (~"
                f"{int(2 * args.chunks * args.gap + 20)} s)",
                flush=True,
            )
        res = engine._call(run_scenarios(engine, chunks, args.gap, params))
    finally:
        engine.shutdown()

    ttft = {name: round(value[0], 3) for name, value in res.items()}
    stream_meta = res["stream"][1]["meta_info"]["stream"]
    summary = {
        "ttft_streaming_s": ttft["stream"],
        "ttft_baseline_s": ttft["wait"],
        "ttft_prefix_warming_s": ttft["warming"],
        "ttft_lower_bound_s": ttft["bound"],
        "speedup": round(ttft["wait"] / ttft["stream"], 2),
        "streaming_over_lower_bound": round(ttft["stream"] / ttft["bound"], 2),
        "output_identical": res["stream"][1]["output_ids"] == res["wait"][1]["output_ids"],
        "prompt_tokens": res["wait"][1]["meta_info"]["prompt_tokens"],
        "unprefilled_at_finish": stream_meta["unprefilled_at_finish"],
        "engine_start_s": round(started, 1),
        "answer": res["stream"][1]["text"].strip(),
    }
    if args.json:
        print(orjson.dumps(summary).decode())
        return 0
    print(f"prompt: {summary['prompt_tokens']} tokens; TTFT from the last chunk's arrival:")
    print(f"  wait for full context (plain SGLang request)  {ttft['wait']:7.3f} s")
    print(f"  SGLang prefix warming (resend, max_new=0)      {ttft['warming']:7.3f} s")
    print(f"  stream2llm stream                              {ttft['stream']:7.3f} s")
    print(f"  lower bound (last chunk prefill + 1 decode)    {ttft['bound']:7.3f} s")
    print(
        f"speedup over waiting: {summary['speedup']}x; stream / lower bound: "
        f"{summary['streaming_over_lower_bound']}x; output identical to waiting: "
        f"{summary['output_identical']}"
    )
    print(f"answer: {summary['answer']}")
    return 0
