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
    POST /generate        {"session_params": {"s2l": {"op", "stream_id", ...}}} with the header
                          x-smg-routing-key: STREAM_ID: any of the commands above (and "status")
                          in the form sglang-router proxies (server/routed.py)
    POST /stream/v1/chat/completions
                          finish a chat stream: an OpenAI chat completion request with
                          "stream_id" (the `openai` client's extra_body), answered by SGLang's
                          own chat completion code (server/chat.py)

Open answers with the stream's status and its `stream_token`; every later call on the stream
(append, update, finish, abort, status, the chat finish) carries it in the `X-Stream-Token`
header, or gets 403 `forbidden` (stream/isolation.py). The one-connection route needs none: the
connection opened the stream. SGLang's `--api-key` middleware covers these routes like its own.

Bodies are typed and strict (server/bodies.py: an unknown field or a wrong type is a 400 that
names it); sampling parameters are checked with SGLang's own class at open and at finish,
before any engine work; stream ids are 1-128 of A-Z a-z 0-9 . _ ~ - (every route can address
them). A stream's chunks are all text or all token ids (`input_ids`); mixing them is a 400.
Errors: {"error": {"code", "message", "stream_id"}} with a 4xx status, on every /stream path
(404 and 405 included). An event-stream finish that fails before its first output answers with
that error's status, not with an event. A client that disconnects while its output streams has
its stream aborted (KV freed).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from s2l_sglang.server.bodies import (
    OPS,
    AppendBody,
    BadRequest,
    FinishBody,
    OpenBody,
    UpdateBody,
    openapi_body,
    parse_body,
    parse_command,
)
from s2l_sglang.server.state import stream_manager
from s2l_sglang.stream.errors import StreamClosed, StreamError
from s2l_sglang.stream.isolation import TOKEN_HEADER

_app = None  # the FastAPI app the routes are on (its state has SGLang's OpenAI serving)


def _max_body_bytes() -> int:
    return stream_manager().config.max_body_bytes


class PayloadTooLarge(StreamError):
    status, code = 413, "payload_too_large"


class NotFound(StreamError):
    status, code = 404, "not_found"


class MethodNotAllowed(StreamError):
    status, code = 405, "method_not_allowed"


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


def _update_text(body: UpdateBody) -> str:
    if body.documents is not None:
        if body.text:
            raise BadRequest("give text or documents, not both", body.stream_id)
        return "\n\n".join(body.documents)
    return body.text


async def _sse(
    first: dict | None, outputs: AsyncIterator[dict], on_disconnect
) -> AsyncIterator[bytes]:
    """The finish's outputs as server-sent events; `first` was taken before the response
    started (an error before it gets a 4xx status, not an event)."""
    try:
        if first is not None:
            yield b"data: " + orjson.dumps(first, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"
            async for out in outputs:
                yield b"data: " + orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"
    except StreamError as exc:
        yield b"data: " + orjson.dumps(exc.to_dict()) + b"\n\n"
    except BaseException:
        await on_disconnect()
        raise
    yield b"data: [DONE]\n\n"


async def _first(outputs: AsyncIterator[dict]) -> dict | None:
    """The finish's first output (None if there is none); a stream error raises here."""
    try:
        return await outputs.__anext__()
    except StopAsyncIteration:
        return None


async def _dispatch(op: str, raw: dict, token: str | None = None, owned: bool = False) -> Any:
    """Run one stream command; returns a status dict, or an async iterator for finish.

    A command on an open stream must carry the stream's `token` (X-Stream-Token), unless the
    connection itself `owned` the stream from its open (`POST /stream`)."""
    mgr = stream_manager()

    def authorized(sid: str) -> str:
        if not owned:
            mgr.authorize(sid, token)
        return sid

    if op == "open":
        body = parse_body("open", raw)
        assert isinstance(body, OpenBody)
        if body.messages is not None:
            return await _open_chat(mgr, body)
        if body.context_message is not None:
            raise BadRequest("context_message needs messages (a chat stream)", body.stream_id)
        sid = body.stream_id if body.stream_id is not None else uuid.uuid4().hex
        return await mgr.open(sid, body.sampling_params, body.text, body.input_ids)
    if op == "append":
        body = parse_body("append", raw)
        assert isinstance(body, AppendBody)
        return await mgr.append(authorized(body.stream_id), body.text, body.input_ids)
    if op == "update":
        body = parse_body("update", raw)
        assert isinstance(body, UpdateBody)
        return await mgr.update(authorized(body.stream_id), _update_text(body), body.input_ids)
    if op == "finish":
        body = parse_body("finish", raw)
        assert isinstance(body, FinishBody)
        return await mgr.finish(
            authorized(body.stream_id),
            body.text,
            body.sampling_params,
            body.input_ids,
            body.keep_open,
        )
    if op == "abort":
        sid = authorized(parse_body("abort", raw).stream_id)
        await mgr.abort(sid)
        return {"stream_id": sid, "aborted": True}
    raise BadRequest(f"unknown op {op!r}", raw.get("stream_id"))


async def _open_chat(mgr: Any, body: OpenBody) -> dict:
    """Open a chat stream: its messages, the index of the one whose content is streamed."""
    sid = body.stream_id if body.stream_id is not None else uuid.uuid4().hex
    for name in ("sampling_params", "input_ids"):
        if getattr(body, name) is not None:
            raise BadRequest(
                f"a chat stream takes no {name!r} (sampling parameters come with the chat "
                "completion request that finishes it; chunks are text)",
                sid,
            )
    if mgr.chat_renderer is None:
        from s2l_sglang.server.chat import renderer

        serving = getattr(getattr(_app, "state", None), "openai_serving_chat", None)
        if serving is None:
            raise BadRequest("this server has no chat serving (no chat template)", sid)
        mgr.chat_renderer = renderer(serving, mgr._tokenize)
    return await mgr.open_chat(sid, body.messages, body.context_message, body.text)


async def _finish_response(sid: str, result: AsyncIterator[dict], as_events: bool) -> Response:
    """The finish's answer: one JSON object, or server-sent events once the first output is
    there (an error before it is answered with its 4xx, not with an event)."""
    mgr = stream_manager()

    async def abort_on_disconnect() -> None:
        if sid in mgr.streams:
            await mgr.abort(sid, "client disconnected")

    if not as_events:
        last: dict = {}
        async for out in result:
            last = out
        return _json_response(last)
    first = await _first(result)
    return StreamingResponse(
        _sse(first, result, abort_on_disconnect), media_type="text/event-stream"
    )


async def _next_piece(mgr: Any, pieces: AsyncIterator[bytes], sid: str | None) -> bytes | None:
    """The next piece of a one-connection body (None at its end). While the connection's
    stream is open, its end (reaped for idleness, say) answers the connection at once."""
    nxt = asyncio.ensure_future(pieces.__anext__())
    if sid is not None and sid in mgr.streams:
        ended = asyncio.ensure_future(mgr.wait_closed(sid))
        await asyncio.wait({nxt, ended}, return_when=asyncio.FIRST_COMPLETED)
        if not nxt.done():
            nxt.cancel()
            raise StreamClosed(f"stream {sid!r} has ended ({ended.result()})", sid)
        ended.cancel()
    try:
        return await nxt
    except StopAsyncIteration:
        return None


def _install_error_handlers(app: Any) -> None:
    """404 and 405 under /stream in our error shape; every other path keeps SGLang's."""
    from fastapi import HTTPException
    from fastapi.exception_handlers import http_exception_handler
    from starlette.exceptions import HTTPException as StarletteHTTPException

    # SGLang's handler for FastAPI's HTTPException, FastAPI's own for Starlette's (404 routes)
    previous = {
        cls: app.exception_handlers.get(cls, http_exception_handler)
        for cls in (HTTPException, StarletteHTTPException)
    }

    async def handler(request: Request, exc: Exception):
        path = request.url.path
        if path == "/stream" or path.startswith("/stream/"):
            status = getattr(exc, "status_code", 404)
            kind = {404: NotFound, 405: MethodNotAllowed}.get(status)
            if kind is not None:
                return _error_response(
                    kind(f"{request.method} {path}: {getattr(exc, 'detail', '')}")
                )
        own = previous[HTTPException if isinstance(exc, HTTPException) else StarletteHTTPException]
        return await own(request, exc)

    for cls in previous:
        app.add_exception_handler(cls, handler)


def install_routes(app: Any) -> None:
    """Add the stream routes to SGLang's FastAPI `app` (idempotent)."""
    global _app
    if getattr(app.state, "s2l_routes", False):
        return
    app.state.s2l_routes = True
    _app = app
    _install_error_handlers(app)
    from s2l_sglang.server import routed

    routed.install(app)  # stream commands carried by POST /generate (sglang-router)

    async def command(op: str, request: Request):
        try:
            raw = _parse(await request.body())
            result = await _dispatch(op, raw, request.headers.get(TOKEN_HEADER))
            if op != "finish":
                return _json_response(result)
            return await _finish_response(raw["stream_id"], result, raw.get("stream", True))
        except StreamError as exc:
            return _error_response(exc)

    for op in OPS:

        async def route(request: Request, _op: str = op):
            return await command(_op, request)

        app.add_api_route(
            f"/stream/{op}",
            route,
            methods=["POST"],
            name=f"s2l_stream_{op}",
            openapi_extra=openapi_body(op),
        )

    async def status(stream_id: str, request: Request):
        try:
            stream_manager().authorize(stream_id, request.headers.get(TOKEN_HEADER))
            return _json_response(stream_manager().status(stream_id))
        except StreamError as exc:
            return _error_response(exc)

    async def set_policy(request: Request):
        """Switch the scheduler's stream policy at run time: {"policy": NAME}."""
        try:
            name = parse_body("policy", _parse(await request.body())).policy
            try:
                return _json_response(await stream_manager().set_policy(name))
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
        except StreamError as exc:
            return _error_response(exc)

    app.add_api_route(
        "/stream/policy",
        set_policy,
        methods=["POST"],
        name="s2l_stream_policy",
        openapi_extra=openapi_body("policy"),
    )

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
        from starlette.requests import ClientDisconnect

        mgr = stream_manager()
        sid: str | None = None
        buffer = b""
        pieces = request.stream().__aiter__()
        try:
            while True:
                piece = await _next_piece(mgr, pieces, sid)
                if piece is None:
                    break
                buffer += piece
                if len(buffer) > mgr.config.max_body_bytes:
                    raise PayloadTooLarge(f"a line over {mgr.config.max_body_bytes} bytes")
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    op, body = parse_command(_parse(line))
                    if op == "open":
                        if sid is not None:
                            raise BadRequest("the stream is already open", sid)
                        sid = (await _dispatch("open", body, owned=True))["stream_id"]
                        continue
                    if sid is None:
                        raise BadRequest("the first command must be open")
                    if body.get("stream_id", sid) != sid:
                        raise BadRequest("a connection carries one stream", sid)
                    body["stream_id"] = sid
                    if op == "finish" and body.get("keep_open"):
                        # the connection ends with its finish's events: nothing could follow
                        raise BadRequest("keep_open needs the per-command routes", sid)
                    result = await _dispatch(op, body, owned=True)
                    if op == "finish":
                        return await _finish_response(sid, result, True)
            raise BadRequest("the body ended without a finish command", sid)
        except StreamError as exc:
            if sid is not None and sid in mgr.streams:
                await mgr.abort(sid, f"bad command: {exc}")
            if exc.stream_id is None:
                exc.stream_id = sid
            return _error_response(exc)
        except ClientDisconnect:  # nobody reads an answer: free the stream, log no traceback
            if sid is not None and sid in mgr.streams:
                await mgr.abort(sid, "client disconnected")
            return Response(status_code=400)
        except BaseException:
            if sid is not None and sid in mgr.streams:
                await mgr.abort(sid, "client disconnected")
            raise

    app.add_api_route(
        "/stream",
        one_connection,
        methods=["POST"],
        name="s2l_stream_connection",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            }
        },
    )
