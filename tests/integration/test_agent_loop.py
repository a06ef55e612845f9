"""Agent loops: a finish that keeps the stream open. The generated tokens join the held context,
a tool's result is appended after them, and the next finish generates again without recomputing
what is held; each generation equals a plain request over the same token ids (float32)."""

from __future__ import annotations

import pytest

from s2l_sglang.stream import EmptyChunk
from tests.integration.test_streams import CONTEXT, GREEDY

pytestmark = pytest.mark.engine

ASK = "\nQuestion: Which tool would you call to find the tower's height?\nAnswer:"
TOOL = "\nTool result: height(Eiffel Tower) = 330 m.\nQuestion: How tall is the tower?\nAnswer:"


def test_a_kept_open_stream_generates_again_after_a_tool_result(engine):
    # The stream's calls come first, the plain references after: the session engine aborts a
    # stream quiet for 3 s, and a reference request on a loaded machine can take longer.
    sid = "agent-loop"
    engine.open_stream(sid, GREEDY, CONTEXT)
    first = engine.finish(sid, ASK, keep_open=True)
    history_tokens = engine.status(sid)["history_tokens"]
    with pytest.raises(EmptyChunk, match="needs new input"):
        engine.finish(sid, keep_open=True)  # nothing new after the history
    engine.append(sid, TOOL)  # the tool's result goes after the generated tokens
    second = engine.finish(sid, keep_open=False)
    assert sid not in engine.streams.streams  # the last finish closed it

    prompt1 = engine.tokenizer(CONTEXT + ASK)["input_ids"]  # as SGLang tokenizes text
    plain1 = engine.generate(input_ids=prompt1, sampling_params=GREEDY)
    assert first["output_ids"] == plain1["output_ids"]
    assert first["meta_info"]["stream"]["kept_open"] is True
    history = prompt1 + first["output_ids"]
    assert history_tokens == len(history)
    prompt2 = history + engine.tokenizer.encode(TOOL, add_special_tokens=False)
    plain2 = engine.generate(input_ids=prompt2, sampling_params=GREEDY)
    assert second["output_ids"] == plain2["output_ids"]
    assert second["meta_info"]["prompt_tokens"] == len(prompt2)
    counters = second["meta_info"]["stream"]
    # every turn recomputes at least its last token; nothing else held was computed twice
    assert counters["prefilled"] <= len(prompt2) + counters["turns"], counters
    # nothing of the history was dropped: at most the tool result's last token, which a final
    # turn always recomputes when everything was already prefilled
    assert counters["invalidated"] <= first["meta_info"]["stream"]["invalidated"] + 1


def test_token_id_agent_loop(engine):
    sid = "agent-ids"
    prompt1 = engine.tokenizer(CONTEXT + ASK)["input_ids"]
    engine.open_stream(sid, GREEDY, input_ids=prompt1)
    first = engine.finish(sid, keep_open=True)
    tool = engine.tokenizer.encode(TOOL, add_special_tokens=False)
    second = engine.finish(sid, input_ids=tool)  # before the reference (3 s idle timeout)
    plain2 = engine.generate(input_ids=prompt1 + first["output_ids"] + tool, sampling_params=GREEDY)
    assert second["output_ids"] == plain2["output_ids"]
