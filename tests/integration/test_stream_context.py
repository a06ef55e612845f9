"""`stream_context` in SGLang programs on the in-process engine (StreamEngineBackend).

A program that streams its context gives the same greedy float32 output (and program text) as
the same program with the whole context given up front, in append and update modes; the gen
really finishes the stream (its meta_info has the stream's counters), and a stream that no gen
finishes, or whose source fails, is aborted. (Whether a refinement invalidates held KV depends on
turn timing; the engine's own tests cover it. Here the output proves the context was replaced.)
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
import sglang as sgl

from frontend import StreamEngineBackend, stream_context
from s2l_sglang.stream import StreamClosed

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built it.",
    "The tower was built from 1887 to 1889 as the centerpiece of the 1889 World's Fair; "
    "it is 330 metres tall, about the height of an 81-storey building.",
    "The Louvre is the world's most-visited museum and a historic landmark in Paris.",
]
QUESTION = "Who designed the Eiffel Tower, and when was it built?"
# Chunk boundaries inside words: the stream re-tokenizes across them.
MAX_TOKENS = 12
CHUNKS = [
    "The Eiffel Tow",
    "er is a wrought-iron lat",
    "tice tower in Paris. Gustave Eif",
    "fel's company built it.",
]


def stream_pieces(state, name: str) -> list[str]:
    """The pieces of a streamed gen as they come (a failed program fails the test with its error)."""
    try:
        return list(state.text_iter(name))
    except KeyError:  # SGLang's text_iter when the program failed before the gen
        raise AssertionError(f"the program failed: {state.error()!r}") from None


@sgl.function
def plain_qa(s, source, mode, context, sid=None):
    s += "Read the passages, then answer.\n\n"
    s += stream_context(source, mode, sid) if source is not None else context
    s += "\nQuestion: " + QUESTION + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


@sgl.function
def chat_qa(s, source, mode, context, sid=None):
    s += sgl.system("Answer from the passages.")
    with s.user():
        s += "Passages:\n"
        s += stream_context(source, mode, sid) if source is not None else context
        s += "\n\nQuestion: " + QUESTION
    s += sgl.assistant(sgl.gen("answer", max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))


def new_sid() -> str:
    return f"lang-{uuid.uuid4().hex[:12]}"


def wait_prefilled(engine, sid: str, limit: float = 2.0) -> None:
    """Wait until the engine holds all the stream's tokens (at most `limit` s: the engine
    fixture aborts a stream idle for 3 s, and waiting is not activity)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        status = engine.status(sid)
        if status["held_tokens"] == status["context_tokens"]:
            return
        time.sleep(0.02)


def paced(engine, sid: str, items, seen: list[int] | None = None):
    """Yield `items`; after each, note the engine's context length and let it prefill."""
    for item in items:
        yield item
        if seen is not None:
            seen.append(engine.status(sid)["context_tokens"])
        wait_prefilled(engine, sid)


async def apaced(engine, sid: str, items):
    for item in items:
        await asyncio.sleep(0.01)
        yield item
        await asyncio.to_thread(wait_prefilled, engine, sid)


@pytest.fixture(scope="module")
def backend(engine):
    return StreamEngineBackend(engine, chat_template_name="chatml")


@pytest.mark.engine
@pytest.mark.parametrize("stream_output", [False, True])
def test_append_mode_equals_context_up_front(engine, backend, stream_output):
    ref = plain_qa.run(source=None, mode=None, context="".join(CHUNKS), backend=backend)
    sid, seen = new_sid(), []
    state = plain_qa.run(
        source=paced(engine, sid, CHUNKS, seen),
        mode="append",
        context=None,
        sid=sid,
        backend=backend,
        stream=stream_output,
    )
    if stream_output:
        pieces = stream_pieces(state, "answer")
        assert len(pieces) > 1 and "".join(pieces) == ref["answer"]
    assert state.error() is None, state.error()
    assert state["answer"] == ref["answer"]
    assert state.text() == ref.text()
    meta, ref_meta = state.get_meta_info("answer"), ref.get_meta_info("answer")
    assert meta["prompt_tokens"] == ref_meta["prompt_tokens"]
    assert meta["id"] == sid
    counters = meta["stream"]
    # open (the text before) + one per chunk + the finish's question
    assert counters["chunks"] == len(CHUNKS) + 2
    assert counters["reused"] > 0
    # each chunk reached the engine as it came, before the program went on
    assert len(seen) == len(CHUNKS) and seen == sorted(set(seen))
    with pytest.raises(StreamClosed, match="finished"):
        engine.status(sid)


@pytest.mark.engine
def test_update_mode_equals_context_up_front(engine, backend):
    refinements = [
        [DOCS[2], DOCS[0]],
        [DOCS[0], DOCS[2]],  # reordered: everything after the text before is invalidated
        [DOCS[0], DOCS[1], DOCS[2]],
        "\n\n".join([DOCS[0], DOCS[1]]),  # a plain string is the whole refined context
    ]
    final = "\n\n".join([DOCS[0], DOCS[1]])
    ref = chat_qa.run(source=None, mode=None, context=final, backend=backend)
    sid = new_sid()
    state = chat_qa.run(
        source=apaced(engine, sid, refinements),
        mode="update",
        context=None,
        sid=sid,
        backend=backend,
    )
    assert state.error() is None, state.error()
    assert state["answer"] == ref["answer"]  # the engine's context was replaced, not appended
    assert state.text() == ref.text()
    assert final in state.text() and DOCS[2] not in state.text()
    counters = state.get_meta_info("answer")["stream"]
    # open (the text before) + one per refinement + the finish's question
    assert counters["chunks"] == len(refinements) + 2


@sgl.function
def no_gen(s, source, sid):
    s += "Context: "
    s += stream_context(source, stream_id=sid)
    s += "\nNo question follows."


@pytest.mark.engine
def test_program_without_gen_aborts_its_stream(engine, backend):
    sid = new_sid()
    state = no_gen.run(source=paced(engine, sid, CHUNKS[:2]), sid=sid, backend=backend)
    state.sync()
    assert state.error() is None
    assert state.text() == "Context: " + "".join(CHUNKS[:2]) + "\nNo question follows."
    with pytest.raises(StreamClosed, match="aborted"):
        engine.status(sid)


@pytest.mark.engine
def test_failing_source_aborts_the_stream_and_fails_the_program(engine, backend):
    sid = new_sid()

    def failing():
        yield from paced(engine, sid, CHUNKS[:1])
        raise RuntimeError("retriever went away")

    state = plain_qa.run(source=failing(), mode="append", context=None, sid=sid, backend=backend)
    assert isinstance(state.error(), RuntimeError)
    with pytest.raises(StreamClosed, match="aborted"):
        engine.status(sid)


def test_stream_context_rejects_bad_arguments():
    with pytest.raises(ValueError):
        stream_context(["a"], mode="prepend")
    with pytest.raises(TypeError):
        stream_context("a whole string is not a stream of chunks")


def test_hook_targets_exist_in_sglang():
    """frontend/hooks.py patches these SGLang methods: an SGLang upgrade must keep them."""
    import pkgutil

    from frontend.hooks import hooks

    for target, fn, kind in hooks():
        assert callable(pkgutil.resolve_name(target)), target
        assert kind == "AROUND" and callable(fn)


# ---- agent loops: stream_context(..., keep_open=True) ----------------------------------------

ASK = "\nQuestion: Which tool would you call to find the tower's height?\nAnswer:"
TOOL = "\nTool result: height(Eiffel Tower) = 330 m.\nQuestion: How tall is the tower?\nAnswer:"


@sgl.function
def agent(s, source, sid):
    s += "Read the passages, then answer.\n\n"
    s += stream_context(source, stream_id=sid, keep_open=True)
    s += ASK
    s += sgl.gen("call", max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    s += TOOL  # a tool's result: appended after the generated tokens
    s += sgl.gen("answer", max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


@pytest.mark.engine
@pytest.mark.parametrize("stream_output", [False, True])
def test_agent_loop_equals_plain_requests_over_the_same_ids(engine, backend, stream_output):
    sid = new_sid()
    state = agent.run(
        source=paced(engine, sid, CHUNKS), sid=sid, backend=backend, stream=stream_output
    )
    if stream_output:
        assert "".join(stream_pieces(state, "answer")) == state["answer"]
    state.sync()
    assert state.error() is None, state.error()
    greedy = {"temperature": 0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}
    before = "Read the passages, then answer.\n\n" + "".join(CHUNKS) + ASK
    prompt1 = engine.tokenizer(before)["input_ids"]  # the stream's text, as SGLang tokenizes it
    plain1 = engine.generate(input_ids=prompt1, sampling_params=greedy)
    assert state["call"] == plain1["text"]
    # the tool's text goes after the generated ids, tokenized on its own (no BOS)
    prompt2 = (
        prompt1 + plain1["output_ids"] + engine.tokenizer.encode(TOOL, add_special_tokens=False)
    )
    plain2 = engine.generate(input_ids=prompt2, sampling_params=greedy)
    assert state["answer"] == plain2["text"]
    assert state.text() == before + plain1["text"] + TOOL + plain2["text"]
    call, answer = state.get_meta_info("call"), state.get_meta_info("answer")
    assert call["id"] == answer["id"] == sid
    assert call["stream"]["kept_open"] is True and answer["stream"]["kept_open"] is True
    assert answer["prompt_tokens"] == len(prompt2)
    counters = answer["stream"]
    # the second generation recomputed nothing held: every turn recomputes at most its last token
    assert counters["prefilled"] <= len(prompt2) + counters["turns"], counters
    assert counters["reused"] >= len(prompt1) + len(plain1["output_ids"]) - counters["turns"]
    with pytest.raises(StreamClosed, match="aborted"):  # the program's end aborted it
        engine.status(sid)


@pytest.mark.engine
def test_backend_flush_cache_waits_for_the_request_that_runs(engine, backend):
    """`flush_cache` while a request runs: SGLang refuses then; the backend waits for the
    engine to go idle and flushes, so the same prompt afterwards finds nothing cached."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    tm = engine.engine.tokenizer_manager
    ids = [654] * 200
    running = threading.Event()

    async def run() -> None:
        params = {"max_new_tokens": 16, "ignore_eos": True}
        req = GenerateReqInput(input_ids=ids, sampling_params=params, stream=True)
        async for out in tm.generate_request(req, None):
            if out.get("output_ids"):
                running.set()

    done = asyncio.run_coroutine_threadsafe(run(), engine.loop)
    assert running.wait(120)
    backend.flush_cache()
    done.result(120)
    again = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
    assert again["meta_info"]["cached_tokens"] == 0
