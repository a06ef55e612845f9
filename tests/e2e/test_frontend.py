"""The frontend over HTTP: `stream_context` with `sgl.RuntimeEndpoint`, and the async client.

Against `s2l serve` (the `server` fixture: started with an API key and a 3 s idle timeout). Greedy float32 output of a streamed context equals
SGLang's own /generate on the final text; errors arrive typed; a stream left unfinished by an
`async with` block is aborted; the one-connection form (POST /stream) gives the same output.
Agent loops (finish with `keep_open`, through the client and through `stream_context`) and
token-id chunks equal /generate over the same token ids.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aiohttp
import pytest
import sglang as sgl

from frontend import (
    BadRequest,
    DuplicateStream,
    EmptyChunk,
    Forbidden,
    InvalidTokenIds,
    MixedInput,
    StreamAPIError,
    StreamClient,
    StreamClosed,
    Unauthorized,
    UnknownStream,
    stream_context,
)
from frontend.errors import error_from_response

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
PASSAGE = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
    "from 1887 to 1889 as the centerpiece of the 1889 World's Fair. "
)
OTHER = "The Louvre is the world's most-visited museum and a historic landmark in Paris. "
QUESTION = "\nQuestion: Who designed the Eiffel Tower, and when was it built?\nAnswer:"
# Chunk boundaries inside words: the stream re-tokenizes across them.
CHUNKS = [PASSAGE[:41], PASSAGE[41:130], PASSAGE[130:]]


def new_sid() -> str:
    return f"e2e-{uuid.uuid4().hex[:12]}"


async def generate(server, text: str | None = None, input_ids: list[int] | None = None) -> dict:
    """SGLang's own /generate on the whole text (or token ids): the non-streaming reference."""
    async with aiohttp.ClientSession(headers=server.headers) as session:
        body = {"text": text, "input_ids": input_ids, "sampling_params": GREEDY}
        body = {k: v for k, v in body.items() if v is not None}
        async with session.post(f"{server.url}/generate", json=body) as resp:
            assert resp.status == 200
            return await resp.json()


async def tokenize(server, text: str, add_special_tokens: bool = True) -> list[int]:
    """The token ids of `text` by the server's own tokenizer (SGLang's /tokenize)."""
    async with aiohttp.ClientSession(headers=server.headers) as session:
        body = {"prompt": text, "add_special_tokens": add_special_tokens}
        async with session.post(f"{server.url}/tokenize", json=body) as resp:
            assert resp.status == 200
            return (await resp.json())["tokens"]


# ---- stream_context over sgl.RuntimeEndpoint ---------------------------------------------------


def stream_pieces(state, name: str) -> list[str]:
    """The pieces of a streamed gen as they come (a failed program fails the test with its error)."""
    try:
        return list(state.text_iter(name))
    except KeyError:  # SGLang's text_iter when the program failed before the gen
        raise AssertionError(f"the program failed: {state.error()!r}") from None


@sgl.function
def plain_qa(s, source, mode, context, sid=None):
    s += "Read the passage, then answer.\n\n"
    s += stream_context(source, mode, sid) if source is not None else context
    s += QUESTION
    s += sgl.gen("answer", max_tokens=12, temperature=0, ignore_eos=True)


@sgl.function
def chat_qa(s, source, mode, context, sid=None):
    s += sgl.system("Answer from the passages.")
    with s.user():
        s += "Passages:\n"
        s += stream_context(source, mode, sid) if source is not None else context
        s += QUESTION
    s += sgl.assistant(sgl.gen("answer", max_tokens=12, temperature=0, ignore_eos=True))


def paced(items, gap: float = 0.3):
    for item in items:
        yield item
        time.sleep(gap)


async def prefilled(server, sid: str, limit: float = 2.0) -> None:
    """Wait until the server holds all the stream's tokens (at most `limit` s: the test server
    aborts a stream idle for 3 s, and waiting is not activity)."""
    deadline = time.monotonic() + limit
    async with connect(server) as client:
        while time.monotonic() < deadline:
            status = await client.status(sid)
            if status["held_tokens"] == status["context_tokens"]:
                return
            await asyncio.sleep(0.05)


async def apaced(server, sid: str, items):
    """Yield `items` (on the program's private event loop), each once the last is prefilled."""
    for item in items:
        yield item
        await prefilled(server, sid)


@pytest.fixture(scope="module")
def endpoint(server):
    return sgl.RuntimeEndpoint(server.url, api_key=server.api_key, chat_template_name="chatml")


def connect(server) -> StreamClient:
    return StreamClient(server.url, api_key=server.api_key)


def test_runtime_endpoint_append_mode_equals_context_up_front(endpoint):
    ref = plain_qa.run(source=None, mode=None, context=PASSAGE, backend=endpoint)
    sid = new_sid()
    state = plain_qa.run(
        source=paced(CHUNKS), mode="append", context=None, sid=sid, backend=endpoint
    )
    assert state.error() is None, state.error()
    assert state["answer"] == ref["answer"]
    assert state.text() == ref.text()
    meta = state.get_meta_info("answer")
    assert meta["id"] == sid
    assert meta["prompt_tokens"] == ref.get_meta_info("answer")["prompt_tokens"]
    assert meta["stream"]["chunks"] == len(CHUNKS) + 2 and meta["stream"]["reused"] > 0


def test_runtime_endpoint_update_mode_streams_output(endpoint, server):
    refinements = [[OTHER, PASSAGE], [PASSAGE, OTHER], [PASSAGE]]
    ref = chat_qa.run(source=None, mode=None, context=PASSAGE, backend=endpoint)
    sid = new_sid()
    state = chat_qa.run(
        source=apaced(server, sid, refinements),
        mode="update",
        context=None,
        sid=sid,
        backend=endpoint,
        stream=True,
    )
    pieces = stream_pieces(state, "answer")
    assert state.error() is None, state.error()
    assert len(pieces) > 1 and "".join(pieces) == ref["answer"]  # the context was replaced
    assert state.text() == ref.text()
    assert state.get_meta_info("answer")["stream"]["chunks"] == len(refinements) + 2


def test_runtime_endpoint_program_without_gen_aborts_its_stream(endpoint, server):
    @sgl.function
    def no_gen(s, sid):
        s += "Context: "
        s += stream_context(iter(CHUNKS), stream_id=sid)

    sid = new_sid()
    state = no_gen.run(sid=sid, backend=endpoint)
    state.sync()
    assert state.error() is None

    async def status():
        async with connect(server) as client:
            await client.status(sid)

    with pytest.raises(StreamClosed, match="aborted"):
        asyncio.run(status())


# ---- the async client ----------------------------------------------------------------------------


async def test_client_happy_path(server):
    final = PASSAGE + OTHER
    async with connect(server) as client:
        async with client.stream(new_sid(), GREEDY, text=CHUNKS[0]) as stream:
            await stream.append(CHUNKS[1])
            await stream.update([PASSAGE, "Something to be replaced."])  # documents
            status = await stream.update(final)
            assert status["stream_id"] == stream.stream_id and status["context_tokens"] > 0
            out = await stream.finish(QUESTION)
        assert stream.closed
        with pytest.raises(StreamClosed, match="finished"):  # exit did not abort it
            await client.status(stream.stream_id)
    ref = await generate(server, final + QUESTION)
    assert out["output_ids"] == ref["output_ids"]
    assert out["text"] == ref["text"]
    assert out["meta_info"]["id"] == stream.stream_id
    assert out["meta_info"]["stream"]["ttft_s"] > 0
    assert out["meta_info"]["stream"]["chunks"] == 5  # open, append, 2 updates, finish


async def test_client_finish_iter_streams_outputs(server):
    async with connect(server) as client:
        async with client.stream(sampling_params=GREEDY) as stream:  # the server names it
            assert stream.stream_id
            for chunk in CHUNKS:
                await stream.append(chunk)
            outs = [out async for out in stream.finish_iter(QUESTION)]
    ref = await generate(server, PASSAGE + QUESTION)
    assert len(outs) > 1
    assert outs[-1]["output_ids"] == ref["output_ids"]
    assert outs[-1]["text"] == ref["text"]
    assert all(ref["text"].startswith(o["text"]) for o in outs)  # cumulative, as /generate's
    assert "ttft_s" in outs[-1]["meta_info"]["stream"]


async def test_async_with_aborts_an_unfinished_stream(server):
    async with connect(server) as client:
        async with client.stream(new_sid(), GREEDY, text=CHUNKS[0]) as stream:
            await stream.append(CHUNKS[1])
            assert (await stream.status())["complete"] is False
        with pytest.raises(StreamClosed, match="aborted") as info:
            await client.status(stream.stream_id)
        assert info.value.code == "stream_closed" and info.value.status == 409

        with pytest.raises(RuntimeError, match="caller failed"):
            async with client.stream(new_sid(), GREEDY, text=CHUNKS[0]) as failing:
                raise RuntimeError("caller failed")
        with pytest.raises(StreamClosed, match="aborted"):
            await client.status(failing.stream_id)


async def test_typed_errors(server):
    async with connect(server) as client:
        with pytest.raises(UnknownStream) as info:
            await client.status("no-such-stream")
        assert info.value.status == 404 and info.value.stream_id == "no-such-stream"
        with pytest.raises(UnknownStream):
            await client.append("no-such-stream", "text")

        sid = new_sid()
        async with client.stream(sid, {"max_new_tokens": 2}, text="Hello there.") as stream:
            with pytest.raises(DuplicateStream):
                await client.open(sid)
            with pytest.raises(EmptyChunk) as info:
                await stream.append("")
            assert info.value.status == 400 and info.value.stream_id == sid
            with pytest.raises(BadRequest, match="field 'text': Input should be a valid string"):
                await stream.append(123)  # type: ignore[arg-type]
            with pytest.raises(BadRequest, match="field 'documents.1'"):
                await stream.update(["a document", 7])  # type: ignore[list-item]
            await stream.finish()
            with pytest.raises(StreamClosed):
                await stream.append("a chunk after finish")

        url, raw = f"{server.url}/stream/open", b"{not json"
        async with client.session.post(url, data=raw, headers=client.headers) as resp:
            err = error_from_response(resp.status, await resp.read())
        assert isinstance(err, BadRequest) and "malformed JSON" in err.message


def test_unauthorized_maps_to_its_own_error():
    err = error_from_response(401, b'{"error": "Unauthorized"}')
    assert isinstance(err, Unauthorized) and err.status == 401 and err.code == "unauthorized"
    err = error_from_response(418, b"teapot")
    assert type(err) is StreamAPIError and err.code == "http_418" and err.status == 418


async def test_missing_or_wrong_api_key_is_unauthorized(server):
    for api_key in (None, "wrong-key"):
        async with StreamClient(server.url, api_key=api_key) as client:
            with pytest.raises(Unauthorized) as info:
                await client.open(new_sid())
            assert info.value.status == 401
            with pytest.raises(Unauthorized):
                async for _ in client.connect([{"op": "open"}]):
                    pass


async def test_one_connection_form(server):
    async def commands():
        yield {"op": "open", "sampling_params": GREEDY, "text": CHUNKS[0]}
        for chunk in CHUNKS[1:]:
            await asyncio.sleep(0.2)  # the request body streams while chunks arrive
            yield {"op": "append", "text": chunk}
        yield {"op": "update", "documents": [PASSAGE, OTHER]}
        yield {"op": "finish", "text": QUESTION}

    async with connect(server) as client:
        outs = [out async for out in client.connect(commands())]
        ref = await generate(server, PASSAGE + "\n\n" + OTHER + QUESTION)
        assert outs[-1]["output_ids"] == ref["output_ids"]
        assert outs[-1]["meta_info"]["stream"]["chunks"] == len(CHUNKS) + 2

        with pytest.raises(BadRequest, match="first command must be open"):
            async for _ in client.connect([{"op": "append", "text": "too early"}]):
                pass


async def test_a_silent_connection_learns_at_once_that_its_stream_was_reaped(server):
    """A one-connection stream that goes quiet is reaped at the idle timeout (3 s here), and
    the connection, still open and sending nothing, gets the error then (before: no answer
    until the client gave up)."""
    quiet = asyncio.Event()

    async def commands():
        yield {"op": "open", "stream_id": new_sid(), "text": CHUNKS[0]}
        await quiet.wait()  # silent from here on; released only when the test ends

    async with connect(server) as client:
        try:
            with pytest.raises(StreamClosed, match="idle"):
                async with asyncio.timeout(120):
                    async for _ in client.connect(commands()):
                        pass
        finally:
            quiet.set()


async def test_a_stream_is_reached_only_with_its_token(server):
    intruder = StreamClient(server.url, api_key=server.api_key, tokens={})  # its own tokens
    async with connect(server) as client, intruder as other:
        sid = new_sid()
        opened = await client.open(sid, GREEDY, text=PASSAGE)
        assert opened["stream_token"] and client.tokens[sid] == opened["stream_token"]
        for call in (
            other.append(sid, "an intruder's chunk"),
            other.update(sid, "an intruder's context"),
            other.status(sid),
            other.abort(sid),
            other.finish(sid, QUESTION),
        ):
            with pytest.raises(Forbidden):
                await call
        other.tokens[sid] = "a guess"
        with pytest.raises(Forbidden):
            await other.append(sid, "still an intruder")
        out = await client.finish(sid, QUESTION)  # nothing above touched the stream
        ref = await generate(server, PASSAGE + QUESTION)
        assert out["output_ids"] == ref["output_ids"]


# ---- agent loops and token ids ---------------------------------------------------------------

ASK = "\nQuestion: Which tool would you call to find the tower's height?\nAnswer:"
TOOL = "\nTool result: height(Eiffel Tower) = 330 m.\nQuestion: How tall is the tower?\nAnswer:"


async def test_client_keep_open_agent_loop(server):
    async with connect(server) as client:
        async with client.stream(new_sid(), GREEDY, text=PASSAGE) as stream:
            first = await stream.finish(ASK, keep_open=True)
            assert not stream.closed and first["meta_info"]["stream"]["kept_open"] is True
            prompt1 = await tokenize(server, PASSAGE + ASK)  # SmolLM2 adds no BOS
            history = prompt1 + first["output_ids"]
            status = await stream.status()
            assert status["history_tokens"] == len(history) == status["held_tokens"]
            with pytest.raises(EmptyChunk, match="needs new input"):
                await stream.finish(keep_open=True)  # nothing new since the generation
            await stream.append(TOOL)  # the tool's result, after the generated tokens
            outs = [out async for out in stream.finish_iter(keep_open=False)]
            assert stream.closed and stream.generations == 2
        with pytest.raises(StreamClosed, match="finished"):  # exit did not abort it
            await client.status(stream.stream_id)
    plain1 = await generate(server, input_ids=prompt1)
    assert first["output_ids"] == plain1["output_ids"]
    prompt2 = history + await tokenize(server, TOOL, add_special_tokens=False)
    plain2 = await generate(server, input_ids=prompt2)
    second = outs[-1]
    assert second["output_ids"] == plain2["output_ids"] and second["text"] == plain2["text"]
    assert second["meta_info"]["prompt_tokens"] == len(prompt2)
    counters = second["meta_info"]["stream"]
    assert counters["kept_open"] is False
    # nothing held was computed twice: every turn recomputes at most its last token
    assert counters["prefilled"] <= len(prompt2) + counters["turns"], counters


async def test_async_with_aborts_a_stream_kept_open(server):
    async with connect(server) as client:
        async with client.stream(new_sid(), GREEDY, text=PASSAGE) as stream:
            out = await stream.finish(ASK, keep_open=True)
            await stream.append(TOOL)
        assert out["meta_info"]["stream"]["kept_open"] is True
        with pytest.raises(StreamClosed, match="aborted"):
            await client.status(stream.stream_id)


async def test_client_token_id_chunks(server):
    ids = await tokenize(server, PASSAGE + OTHER + QUESTION)
    cut1, cut2 = 9, 30
    async with connect(server) as client:
        async with client.stream(new_sid(), GREEDY, input_ids=ids[:cut1]) as stream:
            status = await stream.append(input_ids=ids[cut1:cut2])
            assert status["context_tokens"] == cut2
            await stream.update(input_ids=ids[:cut1] + [ids[5]] * 4)  # replaced below
            await stream.update(input_ids=ids[: cut2 + 5])
            with pytest.raises(MixedInput) as info:
                await stream.append("some text")  # an id stream takes ids only
            assert info.value.status == 400 and info.value.stream_id == stream.stream_id
            with pytest.raises(InvalidTokenIds):
                await stream.append(input_ids=[10**9])
            out = await stream.finish(input_ids=ids[cut2 + 5 :])
    ref = await generate(server, input_ids=ids)
    assert out["output_ids"] == ref["output_ids"] and out["text"] == ref["text"]
    assert out["meta_info"]["prompt_tokens"] == len(ids)

    async with connect(server) as client:  # one call with both: refused before anything opens
        with pytest.raises(MixedInput):
            await client.open(new_sid(), GREEDY, text="text", input_ids=ids[:3])


def test_new_error_codes_map_to_their_errors():
    for code, cls in (("mixed_input", MixedInput), ("invalid_input_ids", InvalidTokenIds)):
        body = b'{"error": {"code": "%s", "message": "m", "stream_id": "s"}}' % code.encode()
        err = error_from_response(400, body)
        assert type(err) is cls and err.code == code and err.stream_id == "s"


@sgl.function
def chat_agent(s, sid):
    s += sgl.system("Answer from the passage.")
    with s.user():
        s += "Passage:\n"
        s += stream_context(iter(CHUNKS), stream_id=sid, keep_open=True)
        s += ASK
    s += sgl.assistant(sgl.gen("call", max_tokens=12, temperature=0, ignore_eos=True))
    s += sgl.user(TOOL)  # a tool's result, appended to the same stream
    s += sgl.assistant(sgl.gen("answer", max_tokens=12, temperature=0, ignore_eos=True))


def test_runtime_endpoint_agent_loop(endpoint, server):
    sid = new_sid()
    state = chat_agent.run(sid=sid, backend=endpoint)
    state.sync()
    assert state.error() is None, state.error()
    call, answer, text = state["call"], state["answer"], state.text()
    before = text[: text.index(call)]  # the program's text up to each gen
    between = text[len(before) + len(call) : text.rindex(answer)]
    assert "Tool result" in between and text.endswith(answer + "<|im_end|>\n")

    async def references():
        prompt1 = await tokenize(server, before)
        plain1 = await generate(server, input_ids=prompt1)
        tool = await tokenize(server, between, add_special_tokens=False)
        prompt2 = prompt1 + plain1["output_ids"] + tool
        return prompt2, plain1, await generate(server, input_ids=prompt2)

    prompt2, plain1, plain2 = asyncio.run(references())
    assert call == plain1["text"] and answer == plain2["text"]
    meta = state.get_meta_info("answer")
    assert meta["id"] == sid and meta["prompt_tokens"] == len(prompt2)
    assert meta["stream"]["kept_open"] is True
    assert meta["stream"]["prefilled"] <= len(prompt2) + meta["stream"]["turns"], meta["stream"]

    async def status():
        async with connect(server) as client:
            await client.status(sid)

    with pytest.raises(StreamClosed, match="aborted"):  # the program's end aborted it
        asyncio.run(status())
