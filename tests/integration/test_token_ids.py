"""Token-id chunks: a stream fed `input_ids` ends with exactly those ids as its prompt, in append
and in update mode (output equal to a plain request over the same ids, float32), and the checks
(vocabulary, no mixing with text) refuse bad chunks without harming the stream."""

from __future__ import annotations

import pytest

from s2l_sglang.stream import EmptyChunk, InvalidTokenIds, MixedInput
from tests.helpers import fresh_salt
from tests.integration.test_streams import CONTEXT, GREEDY, QUESTION, wait_held

pytestmark = pytest.mark.engine


def plain(engine, ids: list[int]) -> dict:
    return engine.generate(input_ids=ids, sampling_params=GREEDY, cache_salt=fresh_salt())


def test_append_stream_of_token_ids_equals_a_plain_request(engine):
    ids = engine.tokenizer.encode(CONTEXT * 2)
    question = engine.tokenizer.encode(QUESTION)
    engine.open_stream("ids-append", GREEDY, input_ids=ids[:17])
    for a in range(17, len(ids), 40):
        engine.append("ids-append", input_ids=ids[a : a + 40])
    wait_held(engine, "ids-append", len(ids))
    out = engine.finish("ids-append", input_ids=question)
    ref = plain(engine, ids + question)
    assert out["output_ids"] == ref["output_ids"]
    assert out["meta_info"]["prompt_tokens"] == len(ids) + len(question)
    assert out["meta_info"]["stream"]["reused"] > 0


def test_update_stream_of_token_ids_keeps_the_common_prefix(engine):
    first = engine.tokenizer.encode(CONTEXT + "Berlin is the capital of Germany.")
    refined = engine.tokenizer.encode(CONTEXT + "Rome is the capital of Italy.")
    question = engine.tokenizer.encode(QUESTION)
    engine.open_stream("ids-update", GREEDY, input_ids=first)
    wait_held(engine, "ids-update", len(first))
    engine.update("ids-update", input_ids=refined)
    out = engine.finish("ids-update", input_ids=question)
    assert out["output_ids"] == plain(engine, refined + question)["output_ids"]
    stream = out["meta_info"]["stream"]
    assert stream["invalidated"] > 0  # the changed tail was dropped ...
    assert stream["reused"] >= len(CONTEXT) // 8  # ... the shared prefix kept


def test_bad_token_chunks_are_refused_and_the_stream_goes_on(engine):
    vocab = engine.engine.tokenizer_manager.model_config.vocab_size
    engine.open_stream("ids-bad", GREEDY, input_ids=engine.tokenizer.encode(CONTEXT))
    with pytest.raises(InvalidTokenIds, match="outside the vocabulary"):
        engine.append("ids-bad", input_ids=[5, vocab])
    with pytest.raises(InvalidTokenIds):
        engine.append("ids-bad", input_ids=[5, "6"])
    with pytest.raises(MixedInput):
        engine.append("ids-bad", "some text")  # the stream takes token ids
    with pytest.raises(MixedInput):
        engine.append("ids-bad", "text", input_ids=[5])  # one call, both kinds
    with pytest.raises(EmptyChunk):
        engine.append("ids-bad", input_ids=[])
    question = engine.tokenizer.encode(QUESTION)
    out = engine.finish("ids-bad", input_ids=question)  # nothing above changed the context
    ref = plain(engine, engine.tokenizer.encode(CONTEXT) + question)
    assert out["output_ids"] == ref["output_ids"]


def test_a_text_stream_refuses_token_ids(engine):
    engine.open_stream("text-then-ids", GREEDY, CONTEXT)
    with pytest.raises(MixedInput, match="does not mix"):
        engine.append("text-then-ids", input_ids=[5, 6])
    engine.abort("text-then-ids")
