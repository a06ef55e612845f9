"""Chat streams over HTTP, finished with the real `openai` client against `s2l serve`.

A chat stream's context is one message's content, streamed in chunks; the finish is an OpenAI
chat completion request (the stream id in `extra_body`) answered by SGLang's own chat code.
Each finish is compared with a plain `/v1/chat/completions` request for the same final messages
through the same client (float32, greedy): same text, same prompt token count.
"""

from __future__ import annotations

import time

import openai
import pytest
import requests

from tests.helpers import fresh_salt

SYSTEM = {"role": "system", "content": "You answer from the given context in a few words."}
CHUNKS = [
    "Context: The Rhine is a European river that begins in the Swiss canton of Graubunden ",
    "and flows through Switzerland, Liechtenstein, Austria, Germany, France and the ",
    "Netherlands, where it empties into the North Sea. It is about 1,230 km long. ",
    "Its largest city on the banks is Cologne.",
]
QUESTION = {"role": "user", "content": "Where does the Rhine begin?"}
ARGS = {"model": "default", "temperature": 0, "max_tokens": 16}


def post(server, route: str, body: dict) -> requests.Response:
    """A stream-route call with the API key and, for a stream opened here, its token."""
    return server.post(route, body, timeout=120)


def token_of(server, sid: str) -> dict[str, str]:
    """The stream's token header for the `openai` client's `extra_headers` (none if unknown)."""
    token = server.tokens.get(sid)
    return {"X-Stream-Token": token} if token else {}


def stream_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/stream/v1", api_key=server.api_key)


def afresh() -> dict:
    """A plain reference's extra body: its own cache namespace, so it reuses no stream KV."""
    return {"cache_salt": fresh_salt()}


def plain_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key)


def wait_prefilled(server, sid: str, timeout: float = 120) -> dict:
    """The stream's status once its held KV covers its whole context."""
    deadline = time.monotonic() + timeout
    while True:
        status = server.status(sid).json()
        if status["held_tokens"] == status["context_tokens"] or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def open_chat(server, sid: str, chunks: list[str]) -> dict:
    body = {"stream_id": sid, "messages": [SYSTEM, {"role": "user"}], "text": chunks[0]}
    resp = post(server, "/stream/open", body)
    assert resp.status_code == 200, resp.text
    for chunk in chunks[1:]:
        resp = post(server, "/stream/append", {"stream_id": sid, "text": chunk})
        assert resp.status_code == 200, resp.text
    return resp.json()


def final_messages(context: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": context}, QUESTION]


def test_chat_stream_finished_with_openai_equals_plain_chat_completion(server):
    open_chat(server, "chat-append", CHUNKS)
    status = wait_prefilled(server, "chat-append")
    # the system prompt and the whole context are held (prefilled) before the finish
    assert status["held_tokens"] == status["context_tokens"] > 50
    assert status["chunks"] == len(CHUNKS)

    out = stream_client(server).chat.completions.create(
        messages=[QUESTION],
        extra_body={"stream_id": "chat-append"},
        extra_headers=token_of(server, "chat-append"),
        **ARGS,
    )
    ref = plain_client(server).chat.completions.create(
        messages=final_messages("".join(CHUNKS)), extra_body=afresh(), **ARGS
    )
    assert out.choices[0].message.content == ref.choices[0].message.content
    assert out.choices[0].message.content
    assert out.usage.prompt_tokens == ref.usage.prompt_tokens
    assert out.usage.completion_tokens == ref.usage.completion_tokens
    assert out.choices[0].finish_reason == ref.choices[0].finish_reason
    assert out.id == "chat-append"
    # the stream is finished: its KV freed, its id ended
    gone = server.status("chat-append")
    assert gone.status_code in (404, 409)


def test_chat_stream_with_update_streamed_with_openai(server):
    draft = "Context: An early draft about rivers of Europe. "
    open_chat(server, "chat-update", [draft, CHUNKS[0]])
    refined = "".join(CHUNKS)
    resp = post(server, "/stream/update", {"stream_id": "chat-update", "text": refined})
    assert resp.status_code == 200, resp.text
    status = wait_prefilled(server, "chat-update")
    assert status["held_tokens"] > 0 and status["invalidated"] > 0

    pieces, usage, finish = [], None, None
    for chunk in stream_client(server).chat.completions.create(
        messages=[QUESTION],
        extra_body={"stream_id": "chat-update"},
        extra_headers=token_of(server, "chat-update"),
        stream=True,
        stream_options={"include_usage": True},
        **ARGS,
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    ref = plain_client(server).chat.completions.create(
        messages=final_messages(refined), extra_body=afresh(), **ARGS
    )
    assert "".join(pieces) == ref.choices[0].message.content
    assert usage is not None and usage.prompt_tokens == ref.usage.prompt_tokens
    assert finish == ref.choices[0].finish_reason


def test_chat_stream_errors_in_our_shape(server):
    client = stream_client(server)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            messages=[QUESTION],
            extra_body={"stream_id": "nope"},
            extra_headers=token_of(server, "nope"),
            **ARGS,
        )
    resp = post(
        server, "/stream/v1/chat/completions", {"stream_id": "nope", "messages": [QUESTION]}
    )
    assert resp.status_code == 404
    assert resp.json()["error"] == {
        "code": "unknown_stream",
        "message": "unknown stream 'nope'",
        "stream_id": "nope",
    }
    no_id = post(server, "/stream/v1/chat/completions", {"messages": [QUESTION]})
    assert no_id.status_code == 400 and no_id.json()["error"]["code"] == "bad_request"

    # a text stream is not a chat stream: refused, and it goes on (finished normally here)
    post(server, "/stream/open", {"stream_id": "chat-text", "text": "Plain text stream."})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            messages=[QUESTION],
            extra_body={"stream_id": "chat-text"},
            extra_headers=token_of(server, "chat-text"),
            **ARGS,
        )
    resp = post(
        server, "/stream/v1/chat/completions", {"stream_id": "chat-text", "messages": [QUESTION]}
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "not_a_chat_stream"
    done = post(
        server,
        "/stream/finish",
        {"stream_id": "chat-text", "sampling_params": {"max_new_tokens": 2}, "stream": False},
    )
    assert done.status_code == 200, done.text

    # a chat stream takes no plain finish and no token ids; a refused OpenAI finish (bad
    # parameters, checked by SGLang) leaves it open
    open_chat(server, "chat-bad", CHUNKS[:1])
    plain = post(server, "/stream/finish", {"stream_id": "chat-bad"})
    assert plain.status_code == 400 and plain.json()["error"]["code"] == "chat_stream"
    ids = post(server, "/stream/append", {"stream_id": "chat-bad", "input_ids": [1, 2]})
    assert ids.status_code == 400
    bad = post(
        server,
        "/stream/v1/chat/completions",
        {"stream_id": "chat-bad", "messages": [QUESTION], "temperature": "hot"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["stream_id"] == "chat-bad"
    out = client.chat.completions.create(
        messages=[QUESTION],
        extra_body={"stream_id": "chat-bad"},
        extra_headers=token_of(server, "chat-bad"),
        **ARGS,
    )
    assert out.choices[0].message.content

    bad_open = post(
        server, "/stream/open", {"stream_id": "chat-x", "messages": [SYSTEM], "context_message": 3}
    )
    assert bad_open.status_code == 400 and bad_open.json()["error"]["code"] == "invalid_messages"
