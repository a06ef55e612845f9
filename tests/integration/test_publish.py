"""A closed stream's KV goes to the radix tree, as a finished plain request's does
(`radix_ext.publish`): a later request with the same context reuses it, and its output is the
output of the same request computed afresh (float32)."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.helpers import fresh_salt
from tests.integration.test_streams import CONTEXT, GREEDY, QUESTION, wait_held

pytestmark = pytest.mark.engine


def wait_published(engine, before: dict, timeout: float = 60.0) -> dict:
    """The counters once one more stream has been published (its session closed)."""
    deadline = time.monotonic() + timeout
    while (counters := engine.sched_counters())["streams_published"] <= before["streams_published"]:
        if time.monotonic() > deadline:
            raise AssertionError(f"no stream published: {counters}")
        time.sleep(0.05)
    return counters


def test_a_closed_streams_context_and_output_are_cached_for_later_requests(engine):
    # A context no other test sends: nothing of it is in the tree before the stream.
    text = f"Report {uuid.uuid4().hex[:8]}. " + CONTEXT * 2
    before = engine.sched_counters()
    engine.open_stream("pub-1", GREEDY, text[:60])
    wait_held(engine, "pub-1", 1)  # the first turn publishes its own prompt (SGLang's way)
    first = engine.status("pub-1")["held_tokens"]
    engine.append("pub-1", text[60:300])
    engine.append("pub-1", text[300:])
    out = engine.finish("pub-1", QUESTION)
    prompt = out["meta_info"]["prompt_tokens"]
    after = wait_published(engine, before)

    # Everything the slot held past what its first turn published went to the tree, none of it
    # a duplicate of what the tree held: the prompt and the output but its last token (whose
    # KV is never computed). A first turn publishes its prompt only if it is chunked or
    # decodes (SGLang checkpoints unfinished requests only): here at most `first` tokens.
    published = after["tokens_published"] - before["tokens_published"]
    adopted = after["tokens_published_adopted"] - before["tokens_published_adopted"]
    held = prompt + len(out["output_ids"]) - 1
    assert held - first <= published <= held, (published, prompt, first)
    assert adopted == published

    # The same request as a plain one reuses all of it (SGLang matches at most prompt - 1) ...
    again = engine.generate(prompt=text + QUESTION, sampling_params=GREEDY)
    assert again["meta_info"]["prompt_tokens"] == prompt
    assert again["meta_info"]["cached_tokens"] == prompt - 1
    # ... and answers as the same request computed afresh (its own cache namespace) does.
    afresh = engine.generate(
        prompt=text + QUESTION, sampling_params=GREEDY, cache_salt=fresh_salt()
    )
    assert afresh["meta_info"]["cached_tokens"] == 0
    assert again["output_ids"] == afresh["output_ids"] == out["output_ids"]

    # A follow-up over the stream's prompt and output reuses the output's KV too.
    ids = engine.tokenizer.encode(text + QUESTION)
    assert len(ids) == prompt
    follow = ids + out["output_ids"] + engine.tokenizer.encode(" Say it again.")
    turn2 = engine.generate(input_ids=follow, sampling_params=GREEDY)
    assert turn2["meta_info"]["cached_tokens"] >= prompt + len(out["output_ids"]) - 1
    turn2_afresh = engine.generate(
        input_ids=follow, sampling_params=GREEDY, cache_salt=fresh_salt()
    )
    assert turn2["output_ids"] == turn2_afresh["output_ids"]


def test_an_update_streams_kept_prefix_and_new_tail_are_published(engine):
    old = f"Memo {uuid.uuid4().hex[:8]}. " + CONTEXT + "Berlin is the capital of Germany. "
    new = old[: len(old) - 35] + "Rome is the capital of Italy, on the Tiber. "
    before = engine.sched_counters()
    engine.open_stream("pub-2", GREEDY, old)
    wait_held(engine, "pub-2", 10)
    engine.update("pub-2", new)
    out = engine.finish("pub-2", QUESTION)
    wait_published(engine, before)
    afresh = engine.generate(prompt=new + QUESTION, sampling_params=GREEDY, cache_salt=fresh_salt())
    assert out["output_ids"] == afresh["output_ids"]
    again = engine.generate(prompt=new + QUESTION, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
    assert again["output_ids"] == out["output_ids"]
    # the replaced tail is not what the tree holds for the refined context
    stale = engine.generate(prompt=old + QUESTION, sampling_params=GREEDY)
    assert stale["meta_info"]["cached_tokens"] < stale["meta_info"]["prompt_tokens"] - 1


def test_publication_switches_off_and_on_at_run_time(engine):
    text = f"Note {uuid.uuid4().hex[:8]}. " + CONTEXT
    assert engine.sched_counters()["publish_at_close"] is True
    try:
        engine.set_publish_at_close(False)
        assert engine.sched_counters()["publish_at_close"] is False
        before = engine.sched_counters()
        engine.open_stream("pub-off", GREEDY, text)
        out = engine.finish("pub-off", QUESTION)
        prompt = out["meta_info"]["prompt_tokens"]
        # the close freed the stream's KV as SGLang's does: a plain request for the same
        # context prefills what the stream's first turn did not publish
        again = engine.generate(prompt=text + QUESTION, sampling_params=GREEDY)
        assert again["meta_info"]["cached_tokens"] < prompt - 1
        assert engine.sched_counters()["streams_published"] == before["streams_published"]
    finally:
        engine.set_publish_at_close(True)
    assert engine.sched_counters()["publish_at_close"] is True
    text2 = f"Note {uuid.uuid4().hex[:8]}. " + CONTEXT
    before = engine.sched_counters()
    engine.open_stream("pub-on", GREEDY, text2)
    out = engine.finish("pub-on", QUESTION)
    wait_published(engine, before)
    again = engine.generate(prompt=text2 + QUESTION, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
