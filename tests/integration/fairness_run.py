"""Committed work against speculative work, run as its own process by test_fairness.py.

One engine (float32, CPU) with a small prefill budget: 256 tokens a step, speculative turns of
at most 128 tokens. Under each policy (switched at run time), six streams keep the engine busy
with prefill of contexts that are not final (six turns of 128 tokens wait at every step: three
times the budget) while plain requests and the final turns of two other streams arrive. Three
of the six are refined at once by an update that keeps a quarter of the first version: the
rest of theirs is a volatile tail (held back, ordered after the other speculative turns). The
scheduler's admission counters say how much speculative work, and how much newer committed
work, SGLang admitted while a committed request waited.

Own process for the reason given in kv_pressure_run.py (an engine shut down in the test
session takes the session's other engines with it).

Usage: python -m tests.integration.fairness_run  (prints one JSON line)
"""

from __future__ import annotations

import asyncio
import json
import os

from tests.helpers import fresh_salt

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
POLICIES = ("default", "fcfs", "lcas", "mcps")
SPECULATIVE_CHUNK = 128
SPECULATIVE_STREAMS = 6


def afresh(eng, prompt: str) -> list[int]:
    """A plain reference's output, computed afresh (its own cache namespace)."""
    return eng.generate(prompt, GREEDY, cache_salt=fresh_salt())["output_ids"]


def text(tag: str, words: int) -> str:
    return f"Report {tag}: " + " ".join(f"{tag}-entry{k}" for k in range(words)) + ". "


async def phase(eng, policy: str) -> dict:
    mgr = eng.streams
    spec = [f"{policy}-spec{i}" for i in range(SPECULATIVE_STREAMS)]
    finals = [f"{policy}-final{i}" for i in range(2)]
    for sid in spec:  # ~600 tokens each: 5 speculative turns of <= 128 tokens
        await mgr.open(sid, {"max_new_tokens": 1}, text(sid, 120))
    for sid in spec[:3]:  # refined: a quarter kept, the rest rewritten (a volatile tail)
        first = text(sid, 120)
        await mgr.update(sid, first[: len(first) // 4] + text(f"{sid}-rev", 90))
    for sid in finals:
        await mgr.open(sid, GREEDY, text(sid, 30))
    # committed work arrives while speculative turns wait and run
    while not any(mgr.status(sid)["held_tokens"] for sid in spec):
        await asyncio.wait({mgr.streams[s].pump for s in spec}, return_when="FIRST_COMPLETED")

    async def plain(i: int) -> list[int]:
        prompt = text(f"{policy}-plain{i}", 25) + "Summary:"
        out = await eng._generate(text=prompt, sampling_params=GREEDY)
        return out["output_ids"]

    async def final(sid: str) -> list[int]:
        outputs = [out async for out in await mgr.finish(sid, "\nSummary:")]
        return outputs[-1]["output_ids"]

    plain_out = await asyncio.gather(*(plain(i) for i in range(3)))
    final_out = await asyncio.gather(*(final(sid) for sid in finals))
    prefilled = [await mgr.wait_prefilled(sid) for sid in spec]  # speculative work not starved
    complete = all(s["held_tokens"] == s["context_tokens"] for s in prefilled)
    held_back = sum(s["held_back"] for s in prefilled)
    for sid in spec:
        await mgr.abort(sid, "test over")
    return {
        "plain": plain_out,
        "final": final_out,
        "spec_complete": complete,
        "held_back": held_back,
    }


def run() -> dict:
    from s2l_sglang.stream.engine import StreamEngine

    os.environ["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] = "1"
    eng = StreamEngine(
        idle_timeout=None,
        log_level="error",
        chunked_prefill_size=256,
        speculative_chunk=SPECULATIVE_CHUNK,
        max_total_tokens=16384,
        context_length=2048,
    )
    try:
        result: dict = {"speculative_chunk": SPECULATIVE_CHUNK, "policies": {}}
        for policy in POLICIES:
            eng.set_stream_policy(policy)
            got = eng._call(phase(eng, policy))
            got["counters"] = eng.sched_counters()
            got["plain_ref"] = [
                afresh(eng, text(f"{policy}-plain{i}", 25) + "Summary:") for i in range(3)
            ]
            got["final_ref"] = [
                afresh(eng, text(f"{policy}-final{i}", 30) + "\nSummary:") for i in range(2)
            ]
            result["policies"][policy] = got
        result["idle"] = eng.sched_counters()
        return result
    finally:
        eng.shutdown()


if __name__ == "__main__":
    print(json.dumps(run()))
