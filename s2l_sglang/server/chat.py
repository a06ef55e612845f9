"""Chat streams over SGLang's own OpenAI layer: rendering, and the OpenAI-shaped finish.

    POST /stream/v1/chat/completions   an OpenAI chat completion request with "stream_id" (an
                                       unmodified `openai` client passes it in `extra_body`)
                                       and the stream's token in the X-Stream-Token header
                                       (`extra_headers`)

A chat stream's context ids are SGLang's chat template over its messages
(`OpenAIServingChat._convert_to_internal_request`, what `/v1/chat/completions` runs; nothing of
the template code is copied). The finish builds the final messages (the stream's, the context
message filled in, then the request's), and hands the request to SGLang's own
`OpenAIServingChat.handle_request` with the rid of the stream's final turn. SGLang renders the
prompt, converts the OpenAI parameters to sampling parameters and calls
`TokenizerManager.generate_request`; the plugin's AROUND hook on it (`final_generate_request`)
finds that rid claimed here and answers with the stream manager's final turn for exactly those
prompt ids (only the tokens after the held KV are computed). SGLang's OpenAI layer formats the
answer (usage, finish_reason, streamed chunks, [DONE]) itself.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from s2l_sglang.rid import final_rid
from s2l_sglang.stream.errors import StreamError
from s2l_sglang.stream.isolation import TOKEN_HEADER


@dataclass
class Claim:
    """A chat finish handed to SGLang's OpenAI layer, waiting for its `generate_request`."""

    sid: str
    t_finish: float
    keep_open: bool = False
    started: bool = False
    error: StreamError | None = None


#: rid of a stream's final turn -> its claim (this process's chat finishes in flight)
_claims: dict[str, Claim] = {}


def prompt_ids_of(adapted: Any, tokenize) -> list[int]:
    """The prompt ids of SGLang's `GenerateReqInput` for a chat request: its `input_ids`, or its
    text tokenized as SGLang tokenizes `/generate` text (`tokenize`). Media is refused."""
    if any(getattr(adapted, name, None) for name in ("image_data", "video_data", "audio_data")):
        raise ValueError("a chat stream takes text messages only (no images, audio or video)")
    if adapted.input_ids is not None:
        ids = adapted.input_ids
        return list(ids.tolist() if hasattr(ids, "tolist") else ids)
    if isinstance(adapted.text, str):
        return list(tokenize(adapted.text))
    raise ValueError("the chat template gave no prompt")


def renderer(serving_chat: Any, tokenize) -> Any:
    """messages -> prompt ids, through SGLang's own conversion of a chat completion request
    (chat template, then tokenizer), as `/v1/chat/completions` does it."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    def render(messages: list[dict]) -> list[int]:
        request = ChatCompletionRequest(messages=messages)
        adapted, _ = serving_chat._convert_to_internal_request(request, None)
        return prompt_ids_of(adapted, tokenize)

    return render


def final_generate_request(original, tokenizer_manager, obj, *args, **kwargs):
    """AROUND `TokenizerManager.generate_request`: a chat finish's request (its rid claimed by
    `chat_completions`) becomes the stream's final turn; any other request is untouched."""
    rid = getattr(obj, "rid", None)
    claim = _claims.pop(rid, None) if isinstance(rid, str) and _claims else None
    if claim is None:
        return original(tokenizer_manager, obj, *args, **kwargs)
    claim.started = True
    return _final_outputs(claim, obj)


async def _final_outputs(claim: Claim, obj: Any) -> AsyncIterator[dict]:
    """The stream's final turn for SGLang's request `obj`; as `generate_request` would yield
    for it: every output if `obj.stream`, else only the last. A stream error reaches SGLang as
    a ValueError (its 400); the route answers it in our error shape."""
    from s2l_sglang.server.state import stream_manager

    mgr = stream_manager()
    want_stream = bool(obj.stream)
    try:
        try:
            ids = prompt_ids_of(obj, mgr._tokenize)
        except ValueError as exc:
            raise StreamError(str(exc), claim.sid) from exc
        outputs = await mgr.finish_chat(claim.sid, ids, obj, claim.t_finish, claim.keep_open)
        last: dict | None = None
        async for out in outputs:
            if want_stream:
                yield out
            last = out
        if not want_stream and last is not None:
            yield last
    except StreamError as exc:
        claim.error = exc
        if claim.sid in mgr.streams:
            await mgr.abort(claim.sid, f"finish failed: {exc}")
        raise ValueError(str(exc)) from exc


class BadChatRequest(StreamError):
    status, code = 400, "bad_request"


def _error(exc: StreamError):
    from fastapi.responses import Response

    return Response(
        orjson.dumps(exc.to_dict()), status_code=exc.status, media_type="application/json"
    )


def _sglang_error(response: Any, sid: str, claim: Claim):
    """SGLang's OpenAI error response (or the stream error behind it) in our error shape."""
    if claim.error is not None:
        return _error(claim.error)
    try:
        message = orjson.loads(bytes(response.body)).get("message", "")
    except Exception:  # not JSON: keep the status
        message = ""
    exc = BadChatRequest(message or "the chat completion request was refused", sid)
    exc.status = response.status_code if 400 <= response.status_code < 500 else 400
    return _error(exc)


async def chat_completions(raw_request: Any, parse, manager) -> Any:
    """POST /stream/v1/chat/completions: finish a chat stream with SGLang's own chat completion
    handling. `parse` reads and checks the body (routes._parse); `manager` the StreamManager."""
    from fastapi.responses import Response, StreamingResponse
    from pydantic import ValidationError
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.utils.json_response import model_json_response

    t_finish = time.perf_counter()
    sid = None
    try:
        body = parse(await raw_request.body())
        sid = body.pop("stream_id", None)
        if not isinstance(sid, str) or not sid:
            raise BadChatRequest("missing field 'stream_id' (a string; extra_body with openai)")
        keep_open = body.pop("keep_open", False)
        if not isinstance(keep_open, bool):
            raise BadChatRequest("field 'keep_open' must be bool", sid)
        if keep_open:
            raise BadChatRequest("keep_open is not supported on a chat stream", sid)
        messages = body.get("messages", [])
        if not isinstance(messages, list):
            raise BadChatRequest("field 'messages' must be a list", sid)
        if body.get("n", 1) not in (1, None):
            raise BadChatRequest("a stream generates one choice (n = 1)", sid)
        manager.authorize(sid, raw_request.headers.get(TOKEN_HEADER))  # 404, 409, 403
        stream_messages = manager.reserve_chat_finish(sid)  # 404 unknown, 400 not a chat stream
    except StreamError as exc:
        if exc.stream_id is None:
            exc.stream_id = sid
        return _error(exc)
    try:
        request = ChatCompletionRequest.model_validate(
            dict(body, messages=stream_messages + messages)
        )
    except ValidationError as exc:
        manager.release_chat_finish(sid)
        return _error(BadChatRequest(f"invalid chat completion request: {exc}", sid))
    rid = final_rid(manager.session_key(sid), manager.streams[sid].generations)
    request.rid = rid
    claim = Claim(sid, t_finish, keep_open)
    _claims[rid] = claim
    try:
        response = await raw_request.app.state.openai_serving_chat.handle_request(
            request, raw_request
        )
    finally:
        _claims.pop(rid, None)
        if not claim.started:  # refused before the final turn: the stream goes on
            manager.release_chat_finish(sid)
    if isinstance(response, Response) and not isinstance(response, StreamingResponse):
        if response.status_code >= 400:
            if claim.started and sid in manager.streams:
                await manager.abort(sid, "finish failed")
            return _sglang_error(response, sid, claim)
        return response
    return model_json_response(response)
