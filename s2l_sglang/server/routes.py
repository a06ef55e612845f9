"""Stream routes on SGLang's HTTP server (FastAPI app of `sglang.srt.entrypoints.http_server`).

    POST /stream/open     {"stream_id"?, "sampling_params"?, "text"? | "input_ids"?} -> status
                          or a chat stream: {"stream_id"?, "messages": [...],
                          "context_message"?: INDEX (default: the last), "text"?}
    POST /stream/append   {"stream_id", "text" | "input_ids"}                        -> status
    POST /stream/update   {"stream_id", "text" | "documents": [str, ...] | "input_ids"} -> status
    POST /stream/finish   {"stream_id", "text"? | "input_ids"?, "sampling_params"?, "stream"?,
                           "keep_open"?: false}
                          -> server-sent events in /generate's format (data: {...} ... [DONE]),
                             or one JSON object with "stream": false
    POST /stream/abort    {"stream_id"}
    GET  /stream/{id}     stream status
    POST /stream/policy   {"policy": NAME}: switch the scheduler's stream policy at run time
    POST /stream          one connection per stream: newline-delimited JSON commands in a
                          streamed request body ({"op": "open"|"append"|"update"|"finish", ...}),
                          answered by the finish's server-sent events
    POST /stream/v1/chat/completions
                          finish a chat stream: an OpenAI chat completion request with
                          "stream_id" (the `openai` client's extra_body), answered by SGLang's
                          own chat completion code (server/chat.py)

A stream's chunks are all text or all token ids (`input_ids`); mixing them is a 400.
Errors: {"error": {"code", "message", "stream_id"}} with a 4xx status. SGLang's `--api-key`
middleware covers these routes like its own. A client that disconnects while its output streams
has its stream aborted (KV freed).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from s2l_sglang.server.state import stream_manager
from s2l_sglang.stream.errors import StreamError

_app = None  # the FastAPI app the routes are on (its state has SGLang's OpenAI serving)


def _max_body_bytes() -> int:
    return stream_manager().config.max_body_bytes


class BadRequest(StreamError):
    status, code = 400, "bad_request"


class PayloadTooLarge(StreamError):
    status, code = 413, "payload_too_large"


def _error_response(exc: StreamError) -> Response:
    return Response(
        orjson.dumps(exc.to_dict()), status_code=exc.status, media_type="application/json"
    )


def _json_response(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def _parse(raw: bytes) -> dict:
    limit = _max_body_bytes()
    if len(raw) > limit:
        raise PayloadTooLarge(f"request body over {limit} bytes")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _field(body: dict, name: str, kind: type | tuple, required: bool = True, default=None):
    value = body.get(name, default)
    if value is None:
        if required:
            raise BadRequest(f"missing field {name!r}", body.get("stream_id"))
        return default
    if not isinstance(value, kind) or (kind is str and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise BadRequest(f"field {name!r} must be {names}", body.get("stream_id"))
    return value


def _update_text(body: dict) -> str:
    if "documents" in body:
        docs = _field(body, "documents", list)
        if not all(isinstance(d, str) for d in docs):
            raise BadRequest("field 'documents' must be a list of strings", body.get("stream_id"))
        return "\n\n".join(docs)
    return _field(body, "text", str, required=False, default="")


def _input_ids(body: dict) -> list | None:
    """The chunk as token ids (`input_ids`), or None for a text chunk (checked by the manager)."""
    return _field(body, "input_ids", list, required=False)


async def _sse(outputs: AsyncIterator[dict], on_disconnect) -> AsyncIterator[bytes]:
    try:
        async for out in outputs:
            yield b"data: " + orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"
    except StreamError as exc:
        yield b"data: " + orjson.dumps(exc.to_dict()) + b"\n\n"
    except BaseException:
        await on_disconnect()
        raise
    yield b"data: [DONE]\n\n"


async def _dispatch(op: str, body: dict) -> Any:
    """Run one stream command; returns a status dict, or an async iterator for finish."""
    mgr = stream_manager()
    if op == "open" and "messages" in body:
        return await _open_chat(mgr, body)
    if op == "open":
        sid = _field(body, "stream_id", str, required=False) or uuid.uuid4().hex
        params = _field(body, "sampling_params", dict, required=False, default={})
        text = _field(body, "text", str, required=False, default="")
        return await mgr.open(sid, params, text, _input_ids(body))
    sid = _field(body, "stream_id", str)
    if op == "append":
        text = _field(body, "text", str, required="input_ids" not in body, default="")
        return await mgr.append(sid, text, _input_ids(body))
    if op == "update":
        return await mgr.update(sid, _update_text(body), _input_ids(body))
    if op == "finish":
        text = _field(body, "text", str, required=False, default="")
        params = _field(body, "sampling_params", dict, required=False)
        keep_open = _field(body, "keep_open", bool, required=False, default=False)
        return await mgr.finish(sid, text, params, _input_ids(body), keep_open)
    if op == "abort":
        await mgr.abort(sid)
        return {"stream_id": sid, "aborted": True}
    raise BadRequest(f"unknown op {op!r}", sid)


async def _open_chat(mgr: Any, body: dict) -> dict:
    """Open a chat stream: its messages, the index of the one whose content is streamed."""
    sid = _field(body, "stream_id", str, required=False) or uuid.uuid4().hex
    for name in ("sampling_params", "input_ids"):
        if body.get(name) is not None:
            raise BadRequest(
                f"a chat stream takes no {name!r} (sampling parameters come with the chat "
                "completion request that finishes it; chunks are text)",
                sid,
            )
    messages = _field(body, "messages", list)
    index = _field(body, "context_message", int, required=False)
    text = _field(body, "text", str, required=False, default="")
    if mgr.chat_renderer is None:
        from s2l_sglang.server.chat import renderer

        serving = getattr(getattr(_app, "state", None), "openai_serving_chat", None)
        if serving is None:
            raise BadRequest("this server has no chat serving (no chat template)", sid)
        mgr.chat_renderer = renderer(serving, mgr._tokenize)
    return await mgr.open_chat(sid, messages, index, text)


def install_routes(app: Any) -> None:
    """Add the stream routes to SGLang's FastAPI `app` (idempotent)."""
    global _app
    if getattr(app.state, "s2l_routes", False):
        return
    app.state.s2l_routes = True
    _app = app

    async def command(op: str, request: Request):
        try:
            body = _parse(await request.body())
            result = await _dispatch(op, body)
        except StreamError as exc:
            return _error_response(exc)
        if op != "finish":
            return _json_response(result)
        sid = body["stream_id"]

        async def abort_on_disconnect() -> None:
            if sid in stream_manager().streams:
                await stream_manager().abort(sid, "client disconnected")

        if body.get("stream", True) is False:
            last: dict = {}
            try:
                async for out in result:
                    last = out
            except StreamError as exc:
                return _error_response(exc)
            return _json_response(last)
        return StreamingResponse(_sse(result, abort_on_disconnect), media_type="text/event-stream")

    for op in ("open", "append", "update", "finish", "abort"):

        async def route(request: Request, _op: str = op):
            return await command(_op, request)

        app.add_api_route(f"/stream/{op}", route, methods=["POST"], name=f"s2l_stream_{op}")

    async def status(stream_id: str):
        try:
            return _json_response(stream_manager().status(stream_id))
        except StreamError as exc:
            return _error_response(exc)

    async def set_policy(request: Request):
        """Switch the scheduler's stream policy at run time: {"policy": NAME}."""
        try:
            body = _parse(await request.body())
            name = _field(body, "policy", str)
            try:
                return _json_response(await stream_manager().set_policy(name))
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
        except StreamError as exc:
            return _error_response(exc)

    app.add_api_route("/stream/policy", set_policy, methods=["POST"], name="s2l_stream_policy")

    async def chat_completions(request: Request):
        """Finish a chat stream with an OpenAI chat completion request (server/chat.py)."""
        from s2l_sglang.server import chat

        return await chat.chat_completions(request, _parse, stream_manager())

    app.add_api_route(
        "/stream/v1/chat/completions",
        chat_completions,
        methods=["POST"],
        name="s2l_stream_chat_completions",
    )
    app.add_api_route("/stream/{stream_id}", status, methods=["GET"], name="s2l_stream_status")

    async def one_connection(request: Request):
        """NDJSON commands in a streamed body; answered by the finish's events."""
        mgr = stream_manager()
        sid: str | None = None
        buffer = b""
        try:
            async for piece in request.stream():
                buffer += piece
                if len(buffer) > mgr.config.max_body_bytes:
                    raise PayloadTooLarge(f"a line over {mgr.config.max_body_bytes} bytes")
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    body = _parse(line)
                    op = _field(body, "op", str)
                    if op == "open":
                        if sid is not None:
                            raise BadRequest("the stream is already open", sid)
                        sid = (await _dispatch("open", body))["stream_id"]
                        continue
                    if sid is None:
                        raise BadRequest("the first command must be open")
                    body["stream_id"] = sid
                    if op == "finish" and body.get("keep_open"):
                        # the connection ends with its finish's events: nothing could follow
                        raise BadRequest("keep_open needs the per-command routes", sid)
                    result = await _dispatch(op, body)
                    if op == "finish":

                        async def abort_on_disconnect(_sid: str = sid) -> None:
                            if _sid in mgr.streams:
                                await mgr.abort(_sid, "client disconnected")

                        return StreamingResponse(
                            _sse(result, abort_on_disconnect), media_type="text/event-stream"
                        )
            raise BadRequest("the body ended without a finish command", sid)
        except StreamError as exc:
            if sid is not None and sid in mgr.streams:
                await mgr.abort(sid, f"bad command: {exc}")
            if exc.stream_id is None:
                exc.stream_id = sid
            return _error_response(exc)
        except BaseException:
            if sid is not None and sid in mgr.streams:
                await mgr.abort(sid, "client disconnected")
            raise

    app.add_api_route("/stream", one_connection, methods=["POST"], name="s2l_stream_connection")
