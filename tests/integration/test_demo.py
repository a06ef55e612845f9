"""`s2l demo`'s four scenarios on the real engine (float32), with short chunks: the same prompt
each way, the stream's output identical to waiting's, and each scenario starting from an empty
prefix cache, so that no TTFT is a cached prompt's."""

from __future__ import annotations

import asyncio

import pytest

from s2l_sglang.demo import QUESTION, _timed_request, build_chunks, run_scenarios
from s2l_sglang.stream.engine import flush_when_idle

pytestmark = pytest.mark.engine


def test_demo_scenarios_each_start_from_an_empty_prefix_cache(engine):
    chunks = build_chunks(engine.tokenizer, 3, 40)
    params = {"temperature": 0, "max_new_tokens": 4}
    res = engine._call(run_scenarios(engine, chunks, 0.3, params))
    assert set(res) == {"wait", "warming", "stream", "bound"}
    encode = engine.streams._tokenize
    prompt = len(encode("".join(chunks) + QUESTION))
    prefix = len(encode("".join(chunks[:-1])))
    out = {name: value[1] for name, value in res.items()}
    assert {o["meta_info"]["prompt_tokens"] for o in out.values()} == {prompt}
    assert out["stream"]["output_ids"] == out["wait"]["output_ids"]
    # each scenario's prefix cache held only what that scenario sent before its final request:
    # a flush refused between scenarios leaves the previous one's whole prompt cached
    assert out["wait"]["meta_info"]["cached_tokens"] == 0
    assert 0 < out["warming"]["meta_info"]["cached_tokens"] <= prefix
    assert 0 < out["bound"]["meta_info"]["cached_tokens"] <= prefix
    stream = out["stream"]["meta_info"]["stream"]
    assert stream["prefilled"] >= prompt  # every token by the stream's own turns
    assert all(ttft > 0 for ttft, _ in res.values())


def test_a_flush_sent_while_a_request_runs_empties_the_cache_once_it_ends(engine):
    """SGLang refuses a flush while a request runs (also a moment after its output returned);
    `flush_when_idle` (the demo's) waits for the engine to go idle instead of leaving the
    cache full."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    tm = engine.engine.tokenizer_manager
    ids = [321] * 200

    async def go() -> int:
        flush = None
        params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        req = GenerateReqInput(input_ids=ids, sampling_params=params, stream=True)
        async for out in tm.generate_request(req, None):
            if flush is None and out.get("output_ids"):  # running: its first token is out
                flush = asyncio.ensure_future(flush_when_idle(tm))
        await flush
        _, again = await _timed_request(tm, ids, {"max_new_tokens": 1})
        return again["meta_info"]["cached_tokens"]

    assert engine._call(go()) == 0
