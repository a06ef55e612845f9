"""Stream commands carried by `POST /generate`, the route sglang-router proxies (docs/router.md).

sglang-router 0.3.2 proxies SGLang's own API only: a `/stream/...` path gets the router's 404,
and the `/generate` body it forwards is its own typed copy of the request, which keeps only
SGLang's fields. One of them is a free map, `session_params`, whose keys all reach the worker;
the router also forwards the `x-smg-routing-key` header, by which its `manual` policy sends
every request of one key to one worker. A stream command therefore travels as

    POST /generate    (header x-smg-routing-key: STREAM_ID, Authorization as usual)
    {"session_params": {"s2l": {"op": "open" | "append" | "update" | "finish" | "abort" | "status",
                                "stream_id": STREAM_ID, "stream_token"?: TOKEN, ...the op's fields}}}

and every turn of a stream reaches the instance that holds its KV. The op's fields are those of
its `/stream/{op}` route (server/bodies.py, as strict); the stream's token goes in the body
because the router does not forward `X-Stream-Token` (the header is read too, for a client that
talks to one server). The answer is the route's: a status, the finish's server-sent events (or
one JSON object with "stream": false), an error in our shape with its 4xx status.

Behind sglang-router in PD mode every command reaches a prefill instance and a decode instance
at once (the router adds the bootstrap fields): the prefill instance answers its copy with a
no-op and the decode instance relays its copy to that prefill instance, whose answer it returns
(pd/relay.py, docs/pd.md); a command sent to a prefill instance directly runs there.

The command is recognised by an ASGI middleware in front of SGLang's app; every other request,
`/generate` included, goes to SGLang untouched (its body replayed as it came). The command must
name its stream and carry the routing key header with the same value (a 400 otherwise: without
it the router would place each turn on its own), and carries its chunk inside `s2l` (a top-level
`text` or `input_ids` beside it is a 400, not silently dropped).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import Response

from s2l_sglang.server.bodies import BadRequest, RoutedCommand, parse_command
from s2l_sglang.server.headers import ROUTING_KEY_HEADER
from s2l_sglang.stream.errors import StreamError
from s2l_sglang.stream.isolation import TOKEN_HEADER

#: the key of `session_params` that carries a stream command
COMMAND_KEY = "s2l"


def command_of(raw: bytes) -> dict | None:
    """The parsed body if `raw` is a `/generate` request that carries a stream command."""
    if b'"' + COMMAND_KEY.encode() + b'"' not in raw:  # cheap test first: most are plain
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # SGLang answers malformed JSON as it does
    if not isinstance(body, dict):
        return None
    params = body.get("session_params")
    if not isinstance(params, dict) or COMMAND_KEY not in params:
        return None
    return body


async def run_command(body: dict, headers: Any, size: int) -> Response:
    """Run the stream command of a `/generate` body (`command_of`) of `size` bytes; the
    route's answer. The size limit comes first, as on the routes (`--max-stream-body-bytes`)."""
    from s2l_sglang.server.routes import (
        PayloadTooLarge,
        _dispatch,
        _error_response,
        _finish_response,
        _json_response,
        _max_body_bytes,
    )
    from s2l_sglang.server.state import disaggregation_mode, stream_manager

    try:
        role = disaggregation_mode()
        if role != "null":  # a PD instance (docs/pd.md, pd/relay.py)
            answer = await _pd_command(role, body, headers)
            if answer is not None:
                return answer
        if size > _max_body_bytes():
            raise PayloadTooLarge(f"request body over {_max_body_bytes()} bytes")
        params = body["session_params"]
        command = params[COMMAND_KEY]
        if not isinstance(command, dict):
            raise BadRequest(f"session_params.{COMMAND_KEY} must be a JSON object")
        op, fields = parse_command(command, RoutedCommand)
        sid = fields["stream_id"]
        others = sorted(k for k in params if k != COMMAND_KEY)
        if others:
            raise BadRequest(f"session_params of a stream command has other keys: {others}", sid)
        for name in ("text", "input_ids", "messages"):  # the router adds null defaults
            if body.get(name) not in (None, "", []):
                raise BadRequest(
                    f"a stream command carries {name!r} inside session_params.{COMMAND_KEY}", sid
                )
        key = headers.get(ROUTING_KEY_HEADER)
        if key != sid:
            raise BadRequest(
                f"a stream command through /generate needs the header {ROUTING_KEY_HEADER}: "
                f"{sid} (the router sends every turn of one key to one instance); got {key!r}",
                sid,
            )
        token = fields.pop("stream_token", None) or headers.get(TOKEN_HEADER)
        if op == "status":
            if set(fields) != {"stream_id"}:
                raise BadRequest("a status command has only stream_id and stream_token", sid)
            stream_manager().authorize(sid, token)
            return _json_response(stream_manager().status(sid))
        result = await _dispatch(op, fields, token)
        if op != "finish":
            return _json_response(result)
        return await _finish_response(sid, result, fields.get("stream", True))
    except StreamError as exc:
        return _error_response(exc)


async def _pd_command(role: str, body: dict, headers: Any) -> Response | None:
    """A command on a PD instance: the router's prefill copy is answered at once with a no-op,
    the decode copy is relayed to the prefill instance and answered with its answer; a command
    sent to a prefill instance directly runs there (None)."""
    from s2l_sglang.pd import relay
    from s2l_sglang.server.routes import _json_response
    from s2l_sglang.server.state import pd_router_url

    if role == "prefill":
        return _json_response(relay.PREFILL_COPY_ANSWER) if relay.via_pd_router(body) else None
    command = body["session_params"].get(COMMAND_KEY)
    sid = command.get("stream_id") if isinstance(command, dict) else None
    try:
        if relay.via_pd_router(body):
            return await relay.relay_of(pd_router_url()).relay(body, headers)
        raise BadRequest(
            "a PD decode instance holds no streams: send stream commands to the PD router", sid
        )
    except StreamError as exc:
        return relay.unsized(orjson.dumps(exc.to_dict()), exc.status)


class StreamCommands:
    """ASGI middleware: `POST /generate` requests that carry a stream command run it; every
    other request goes on to `app` as it came."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/generate":
            await self.app(scope, receive, send)
            return
        pieces, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body came: nobody to answer
            pieces.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(pieces)
        body = command_of(raw)
        if body is None:
            await self.app(scope, _replay(raw, receive), send)
            return
        from starlette.datastructures import Headers

        response = await run_command(body, Headers(scope=scope), len(raw))
        await response(scope, receive, send)


def _replay(raw: bytes, receive: Any) -> Any:
    """A `receive` that gives the buffered body once, then the connection's own messages (its
    disconnect, which SGLang watches to abort a request)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


def install(app: Any) -> None:
    """Put the middleware innermost, right in front of SGLang's routes: the middlewares SGLang
    adds (its CORS headers, request decompression, metrics, and at launch its `--api-key` check)
    all run before it, for commands as for every request. Starlette runs `user_middleware` in
    list order, outermost first; `add_middleware` would put it outermost."""
    from starlette.middleware import Middleware

    if any(m.cls is StreamCommands for m in app.user_middleware):
        return
    if getattr(app, "middleware_stack", None) is not None:
        raise RuntimeError("the app has started: a middleware cannot be added any more")
    app.user_middleware.append(Middleware(StreamCommands))
