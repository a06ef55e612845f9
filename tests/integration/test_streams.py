"""Streams in the real engine: token-exact output for append and update, merging, counters."""

from __future__ import annotations

import time

import pytest

from s2l_sglang.stream import StreamClosed
from tests.helpers import fresh_salt

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}

CONTEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
    "from 1887 to 1889. Locally nicknamed 'La dame de fer', it was constructed as the "
    "centerpiece of the 1889 World's Fair. The tower is 330 metres tall, about the same height "
    "as an 81-storey building, and the tallest structure in Paris. "
)
QUESTION = "\nQuestion: Who designed the Eiffel Tower, and when was it built?\nAnswer:"


def reference(engine, text: str) -> dict:
    """A plain request for `text`, tokenized by SGLang itself, computed afresh (its own cache
    namespace: no KV of the streams before it is reused)."""
    return engine.generate(prompt=text, sampling_params=GREEDY, cache_salt=fresh_salt())


def wait_held(engine, sid: str, tokens: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = engine.status(sid)
        if status["held_tokens"] >= tokens:
            return status
        time.sleep(0.05)
    raise AssertionError(f"stream {sid} held {status['held_tokens']} < {tokens} tokens")


def test_append_stream_output_equals_non_streaming(engine):
    text = CONTEXT * 2 + QUESTION
    # Chunk boundaries inside words: chunk-by-chunk tokenization would differ from the whole.
    cuts = [0, 37, 101, 250, 333, 480, 611, len(CONTEXT * 2)]
    engine.open_stream("append-1", GREEDY, text[: cuts[1]])
    for a, b in zip(cuts[1:-1], cuts[2:], strict=True):
        engine.append("append-1", text[a:b])
        wait_held(engine, "append-1", 1)
    out = engine.finish("append-1", text[cuts[-1] :])
    ref = reference(engine, text)
    assert out["output_ids"] == ref["output_ids"]
    assert out["meta_info"]["prompt_tokens"] == ref["meta_info"]["prompt_tokens"]
    stream = out["meta_info"]["stream"]
    assert out["meta_info"]["id"] == "append-1"
    assert stream["reused"] > 0 and stream["ttft_s"] > 0
    assert stream["unprefilled_at_finish"] < ref["meta_info"]["prompt_tokens"]
    assert 0.0 <= stream["waited_for_turn_s"] <= stream["ttft_s"]


def test_unprefilled_at_finish_leaves_out_what_the_prefix_cache_held(engine):
    """A stream whose whole context comes with its finish, text that a plain request put in
    the prefix cache just before: the final turn prefills only what SGLang did not find there,
    and `unprefilled_at_finish` says that much (it counted the whole prompt before), as the
    benchmark's other modes count it (prompt less SGLang's cached tokens)."""
    text = f"Note {fresh_salt()}: " + CONTEXT + QUESTION  # no earlier request's KV matches it
    engine.generate(prompt=text, sampling_params=GREEDY)  # default namespace, as streams'
    engine.open_stream("cached-1", GREEDY)
    out = engine.finish("cached-1", text)
    stream = out["meta_info"]["stream"]
    assert stream["reused"] > 0, stream  # the prefix cache held part of it
    assert stream["prefilled"] < out["meta_info"]["prompt_tokens"]
    assert stream["unprefilled_at_finish"] == stream["prefilled"], stream


def test_update_stream_output_equals_non_streaming(engine):
    docs = [
        "Berlin is the capital of Germany. ",
        CONTEXT,
        "The Louvre is the world's most-visited museum. ",
    ]
    engine.open_stream("update-1", GREEDY, docs[0] + docs[1])
    wait_held(engine, "update-1", 10)
    engine.update("update-1", docs[1] + docs[0])  # LCP 0: everything invalidated
    wait_held(engine, "update-1", 10)
    engine.update("update-1", docs[1] + docs[2])  # LCP inside: suffix invalidated
    wait_held(engine, "update-1", 10)
    engine.update("update-1", docs[1])  # shrink to a prefix
    out = engine.finish("update-1", QUESTION)
    ref = reference(engine, docs[1] + QUESTION)
    assert out["output_ids"] == ref["output_ids"]
    assert out["meta_info"]["prompt_tokens"] == ref["meta_info"]["prompt_tokens"]
    assert out["meta_info"]["stream"]["invalidated"] > 0


def test_chunks_sent_during_a_turn_are_merged(engine):
    engine.open_stream("merge-1", GREEDY)
    pieces = [CONTEXT[i : i + 20] for i in range(0, len(CONTEXT), 20)]
    for piece in pieces:  # no waiting: chunks arrive while a turn is in flight
        engine.append("merge-1", piece)
    out = engine.finish("merge-1", QUESTION)
    stream = out["meta_info"]["stream"]
    assert stream["chunks"] == len(pieces) + 1
    assert stream["turns"] < len(pieces)
    assert out["output_ids"] == reference(engine, CONTEXT + QUESTION)["output_ids"]


def test_concurrent_streams_with_appends_and_updates(engine):
    import threading

    results: dict[str, dict] = {}

    def run(sid: str, final: str, mode: str) -> None:
        engine.open_stream(sid, GREEDY, final[:50])
        if mode == "append":
            engine.append(sid, final[50:200])
            engine.append(sid, final[200:])
        else:
            engine.update(sid, "Something else entirely. " + final[:100])
            engine.update(sid, final)
        results[sid] = engine.finish(sid, QUESTION)

    jobs = {
        "conc-a": (CONTEXT, "append"),
        "conc-b": (CONTEXT[::-1][:300] + CONTEXT, "update"),
        "conc-c": (CONTEXT[100:] + CONTEXT[:100], "append"),
    }
    threads = [threading.Thread(target=run, args=(sid, t, m)) for sid, (t, m) in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for sid, (final, _) in jobs.items():
        assert results[sid]["output_ids"] == reference(engine, final + QUESTION)["output_ids"], sid


def test_finished_stream_rejects_more_chunks(engine):
    engine.open_stream("done-1", {"max_new_tokens": 2}, "Hello there.")
    engine.finish("done-1")
    with pytest.raises(StreamClosed):
        engine.append("done-1", "more")
    with pytest.raises(StreamClosed):
        engine.finish("done-1")
