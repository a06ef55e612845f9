"""No deadlock under KV pressure: more concurrent streams than the KV pool holds all complete,
for every policy, with output equal to non-streaming requests (float32, real engine)."""

from __future__ import annotations

import threading
import time

import pytest

from s2l_sglang.sched.policy import policy_names

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
QUESTION = "\nQuestion: What is this text about?\nAnswer:"
POOL_TOKENS = 700  # the KV pool: fewer tokens than the streams below hold together


def context(i: int) -> str:
    words = [f"item{i}-{k}" for k in range(50)]
    return f"Document {i}: " + " ".join(words) + ". "


@pytest.fixture(scope="module", params=policy_names())
def small_engine(request):
    from s2l_sglang.stream.engine import StreamEngine

    eng = StreamEngine(
        stream_policy=request.param,
        log_level="error",
        max_total_tokens=POOL_TOKENS,
        context_length=512,
        chunked_prefill_size=128,
    )
    yield eng
    eng.shutdown()


def test_more_streams_than_kv_all_complete_with_identical_output(small_engine):
    eng = small_engine
    n = 4
    sizes = [len(eng.tokenizer.encode(context(i), add_special_tokens=False)) for i in range(n)]
    assert sum(sizes) > POOL_TOKENS  # the streams cannot all hold their KV at once
    for i in range(n):  # all open and prefilled; idle streams hold KV
        eng.open_stream(f"p{i}", GREEDY, context(i)[:150])
        eng.append(f"p{i}", context(i)[150:])
        time.sleep(0.2)
    results: dict[int, dict] = {}

    def finish(i: int) -> None:
        results[i] = eng.finish(f"p{i}", QUESTION)

    threads = [threading.Thread(target=finish, args=(i,)) for i in reversed(range(n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert sorted(results) == list(range(n)), "a stream did not complete"
    for i in range(n):
        ids = eng.tokenizer.encode(context(i) + QUESTION, add_special_tokens=False)
        ref = eng.generate(input_ids=ids, sampling_params=GREEDY)
        assert results[i]["output_ids"] == ref["output_ids"], i
