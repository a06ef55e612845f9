"""No deadlock under KV pressure: more concurrent streams than the KV pool holds all complete,
for every policy and preemption mode, with output equal to non-streaming requests (float32, real
engine), and the scheduler's counters show the preemptions that made room."""

from __future__ import annotations

import os
import threading
import time

import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
QUESTION = "\nQuestion: What is this text about?\nAnswer:"
POOL_TOKENS = 700  # the KV pool: fewer tokens than the streams below hold together
STREAMS = 4

pytestmark = pytest.mark.engine

# Every policy, each with a preemption mode; `auto` uses the profile shipped for this setup.
CASES = [("default", "recompute"), ("fcfs", "swap"), ("lcas", "auto"), ("mcps", "swap")]


def context(i: int) -> str:
    words = [f"item{i}-{k}" for k in range(50)]
    return f"Document {i}: " + " ".join(words) + ". "


@pytest.fixture(scope="module", params=CASES, ids=[f"{p}-{m}" for p, m in CASES])
def small_engine(request):
    from s2l_sglang.stream.engine import StreamEngine

    policy, preemption = request.param
    saved = {k: os.environ.get(k) for k in ("S2L_STREAM_POLICY", "S2L_PREEMPTION")}
    os.environ["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] = "1"  # a leaked KV slot fails
    eng = StreamEngine(
        stream_policy=policy,
        preemption=preemption,
        idle_timeout=None,
        log_level="error",
        max_total_tokens=POOL_TOKENS,
        context_length=512,
        chunked_prefill_size=128,
    )
    yield eng, policy, preemption
    eng.shutdown()
    for key, value in saved.items():  # later engines of this session get their own settings
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_more_streams_than_kv_all_complete_with_identical_output(small_engine):
    eng, policy, preemption = small_engine
    sizes = [len(eng.tokenizer.encode(context(i), add_special_tokens=False)) for i in range(4)]
    assert sum(sizes) > POOL_TOKENS  # the streams cannot all hold their KV at once
    for i in range(STREAMS):  # all open and prefilled in two chunks; idle streams hold KV
        eng.open_stream(f"p{i}", GREEDY, context(i)[:150])
        eng.append(f"p{i}", context(i)[150:])
        time.sleep(0.2)
    results: dict[int, dict] = {}

    def finish(i: int) -> None:
        results[i] = eng.finish(f"p{i}", QUESTION)

    threads = [threading.Thread(target=finish, args=(i,)) for i in reversed(range(STREAMS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert sorted(results) == list(range(STREAMS)), "a stream did not complete"
    for i in range(STREAMS):
        ids = eng.tokenizer.encode(context(i) + QUESTION, add_special_tokens=False)
        ref = eng.generate(input_ids=ids, sampling_params=GREEDY)
        assert results[i]["output_ids"] == ref["output_ids"], i

    counters = eng.sched_counters()
    assert counters["policy"] == policy
    preempted = counters["preemptions_recompute"] + counters["preemptions_swap"]
    assert preempted > 0, counters  # the pool was too small: streams had to give up KV
    if preemption == "swap":
        assert counters["preemption"] == "swap" and counters["preemptions_swap"] > 0, counters
        assert counters["tokens_swapped_out"] > 0
    elif preemption == "recompute":
        assert counters["preemption"] == "recompute" and counters["preemptions_swap"] == 0
    else:  # auto: the shipped profile of the embedded model on CPU was found and used
        assert counters["preemption"] == "auto", counters
        assert counters["profile"] and counters["profile"].endswith(".json")
    assert counters["host_kv_used"] == 0  # finished streams left nothing in the host pool
