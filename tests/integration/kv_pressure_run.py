"""The KV-pressure scenario, run as its own process by test_kv_pressure.py.

Own process because SGLang's `Engine.shutdown()` kills every child process of its process
(`kill_process_tree(os.getpid(), include_parent=False)`): an in-process engine shut down inside
the test session would take the session's other engines and servers with it.

Usage: python -m tests.integration.kv_pressure_run POLICY PREEMPTION  (prints one JSON line)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from tests.helpers import fresh_salt

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
QUESTION = "\nQuestion: What is this text about?\nAnswer:"
POOL_TOKENS = 700  # the KV pool: fewer tokens than the streams below hold together
STREAMS = 4


def afresh(eng, prompt: str | list[int]) -> list[int]:
    """A plain reference's output for a text or token ids, computed afresh (its own cache
    namespace: no KV of the streams, published to the radix tree when they close, is reused)."""
    given = {"prompt": prompt} if isinstance(prompt, str) else {"input_ids": prompt}
    return eng.generate(**given, sampling_params=GREEDY, cache_salt=fresh_salt())["output_ids"]


def context(i: int) -> str:
    words = [f"item{i}-{k}" for k in range(50)]
    return f"Document {i}: " + " ".join(words) + ". "


def wait_prefilled(eng, sid: str, timeout: float = 300.0) -> None:
    """Until the engine holds all of stream `sid`'s context (its status, polled)."""
    deadline = time.monotonic() + timeout
    while (status := eng.status(sid))["held_tokens"] < status["context_tokens"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {sid} not prefilled in {timeout} s: {status}")
        time.sleep(0.05)


def until_counters(eng, done, what: str, timeout: float = 120.0, poll: float = 0.02) -> dict:
    """The scheduler's counters (polled) once `done(counters)` holds; TimeoutError after
    `timeout` seconds, naming `what` was awaited."""
    deadline = time.monotonic() + timeout
    while not done(counters := eng.sched_counters()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not in {timeout} s: {counters}")
        time.sleep(poll)
    return counters


def engine(policy: str, preemption: str, chunk: int = 128, **stream):
    """An engine with the small KV pool, idle streams never aborted, and KV that nobody holds
    failing SGLang's idle check; `stream`: more StreamEngine settings."""
    from s2l_sglang.stream.engine import StreamEngine

    os.environ["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] = "1"
    return StreamEngine(
        stream_policy=policy,
        preemption=preemption,
        idle_timeout=None,
        log_level="error",
        max_total_tokens=POOL_TOKENS,
        context_length=512,
        chunked_prefill_size=chunk,
        **stream,
    )


def run(policy: str, preemption: str) -> dict:
    eng = engine(policy, preemption)
    sizes = [len(eng.tokenizer.encode(context(i), add_special_tokens=False)) for i in range(4)]
    # Open each stream in two chunks and wait until the engine holds its whole context before
    # the next opens: idle streams hold KV, and from the third stream on the pool cannot hold
    # them all, so prefill and finals must preempt whatever the machine's speed (with a fixed
    # sleep instead, a slow machine left later streams unprefilled and nothing was preempted).
    for i in range(STREAMS):
        eng.open_stream(f"p{i}", GREEDY, context(i)[:150])
        eng.append(f"p{i}", context(i)[150:])
        wait_prefilled(eng, f"p{i}")
    results: dict[int, dict] = {}

    def finish(i: int) -> None:
        results[i] = eng.finish(f"p{i}", QUESTION)

    threads = [threading.Thread(target=finish, args=(i,)) for i in reversed(range(STREAMS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    # Before any other request: the finished streams' host copies go with their sessions
    # (before, they stayed until a later request's admission dropped them lazily).
    deadline = time.monotonic() + 60
    while (counters := eng.sched_counters())["host_copies"] and time.monotonic() < deadline:
        time.sleep(0.1)
    refs = {}
    for i in range(STREAMS):
        refs[i] = afresh(eng, context(i) + QUESTION)
    return {
        "pool": POOL_TOKENS,
        "sizes": sizes,
        "outputs": {i: r["output_ids"] for i, r in results.items()},
        "refs": refs,
        "counters": counters,
    }


def run_locked_prefix(policy: str) -> dict:
    """A plain request whose prefix is evictable cache, waiting while a stream prefills
    beside it (issue 12's memory-pressure stall, 2026-12-03). Its admission locks that prefix,
    so the free KV it finds is what the allocator has: less than it needs once the stream
    holds its context and goes idle. The stream must give its KV up for it; if the plan counts
    the locked prefix as free, nothing is preempted, SGLang admits nothing, and nothing else
    would ever free the KV (the stall fallback would, after `STALL_STEPS` steps: counted)."""
    # The stream prefills for many steps (16-token chunks) as one turn (`speculative_chunk`
    # above its ~320 tokens), and the request is sent once the stream's KV has taken 256
    # tokens of the pool (the scheduler's own count), so that it no longer fits beside it,
    # while that prefill still runs. Sent at once, the request at times reached the
    # scheduler before the stream had taken that much and was admitted while it still fitted
    # (a CI run of 2026-12-07: no preemption); sent once the stream idles, the plan's count
    # was not put to the test (checked: a preemption with either count).
    eng = engine(policy, "recompute", chunk=16, speculative_chunk=512)
    cached = context(0) + QUESTION
    eng.generate(prompt=cached, sampling_params=GREEDY)  # its KV stays as evictable cache
    before = eng.sched_counters()
    # one stream of ~330 tokens: the pool then has fewer free tokens than the request's extend
    eng.open_stream("a", GREEDY, context(1) + context(2)[:150])
    taken = before["kv_available"] - 256
    until_counters(eng, lambda c: c["kv_available"] <= taken, "256 tokens of stream KV", poll=0.002)
    prompt = cached + context(3)[:330]  # ~135 tokens past the cached prefix
    out: dict = {}
    thread = threading.Thread(
        target=lambda: out.update(eng.generate(prompt=prompt, sampling_params=GREEDY))
    )
    thread.start()
    thread.join(timeout=240)
    counters = eng.sched_counters()
    stream = eng.status("a")["context_tokens"]
    ref = None
    if "output_ids" in out:
        eng.abort("a")
        ref = afresh(eng, prompt)
    tok = eng.tokenizer
    return {
        "pool": POOL_TOKENS,
        "cached": len(tok.encode(cached)),
        "stream": stream,
        "prompt": len(tok.encode(prompt)),
        "free_before": [before["kv_available"], before["kv_evictable"]],
        "output": out.get("output_ids"),
        "ref": ref,
        "counters": counters,
    }


def run_reserve(policy: str) -> dict:
    """Streams whose contexts together outgrow the KV pool, and a plain request sent while
    their prefill is held: speculative KV leaves the reserve free (`sched.decide.hold`), so
    the plain request is admitted without any stream giving up its KV, and every stream
    still completes once the others finish."""
    eng = engine(policy, "recompute")
    tok = eng.tokenizer
    sizes = [len(tok.encode(context(i), add_special_tokens=False)) for i in range(STREAMS)]
    prompt = " ".join(context(9).split()[:40]) + QUESTION  # fits in the reserve
    for i in range(STREAMS):
        eng.open_stream(f"p{i}", GREEDY, context(i))
    # until a turn is held: the streams' KV has reached the pool less the reserve
    until_counters(eng, lambda c: c["turns_held_for_kv"], "a turn held for KV")
    plain = eng.generate(prompt=prompt, sampling_params=GREEDY)["output_ids"]
    after_plain = eng.sched_counters()
    results: dict[int, dict] = {}

    def finish(i: int) -> None:
        results[i] = eng.finish(f"p{i}", QUESTION)

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    refs = {i: afresh(eng, context(i) + QUESTION) for i in range(STREAMS)}
    return {
        "pool": POOL_TOKENS,
        "speculative_chunk": eng.config.speculative_chunk,
        "sizes": sizes,
        "prompt": len(tok.encode(prompt)),
        "plain": plain,
        "plain_ref": afresh(eng, prompt),
        "after_plain": after_plain,
        "outputs": {i: r["output_ids"] for i, r in results.items()},
        "refs": refs,
        "counters": eng.sched_counters(),
    }


TOOL = "\nTool result: 42 items.\nQuestion: How many items are there?\nAnswer:"


def run_agent_swap(policy: str) -> dict:
    """An agent loop's kept-open stream, idle while its tool runs, is swapped out for another
    stream's prefill; its next finish takes its KV back, the tokens it generated included
    (before, the host copy held its prompt only and the output was prefilled again)."""
    # no reserve for committed work: the pool alone decides when a stream must give up KV
    eng = engine(policy, "swap", speculative_reserve=0)
    tok = eng.tokenizer
    eng.open_stream("agent", GREEDY, context(0))
    first = eng.finish("agent", QUESTION, keep_open=True)
    before = eng.sched_counters()
    # while the agent's tool runs, a stream whose context does not fit beside the agent's
    # KV: the agent, the one idle stream holding KV, is swapped out
    other = context(1) + context(2)
    eng.open_stream("other", GREEDY, other)
    wait_prefilled(eng, "other")
    swapped = eng.sched_counters()
    eng.append("agent", TOOL)
    second = eng.finish("agent", keep_open=False)
    eng.abort("other")
    prompt1 = tok(context(0) + QUESTION)["input_ids"]  # as SGLang tokenizes text
    history = prompt1 + first["output_ids"]
    prompt2 = history + tok.encode(TOOL, add_special_tokens=False)

    return {
        "pool": POOL_TOKENS,
        "other": len(tok.encode(other, add_special_tokens=False)),
        "history": len(history),
        "prompt1": len(prompt1),
        "prompt2": len(prompt2),
        "first": first["output_ids"],
        "first_ref": afresh(eng, prompt1),
        "second": second["output_ids"],
        "second_ref": afresh(eng, prompt2),
        "second_prompt_tokens": second["meta_info"]["prompt_tokens"],
        "stream": second["meta_info"]["stream"],
        "before": before,
        "swapped": swapped,
        "counters": eng.sched_counters(),
    }


if __name__ == "__main__":
    if sys.argv[1] == "agent-swap":
        print(json.dumps(run_agent_swap(sys.argv[2])), flush=True)
    elif sys.argv[1] == "locked-prefix":
        print(json.dumps(run_locked_prefix(sys.argv[2])), flush=True)
    elif sys.argv[1] == "reserve":
        print(json.dumps(run_reserve(sys.argv[2])), flush=True)
    else:
        print(json.dumps(run(sys.argv[1], sys.argv[2])), flush=True)
    os._exit(0)  # the engine's processes go with this one
