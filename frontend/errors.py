"""Typed errors of the stream API as a client sees them, keyed by the server's error code.

The server answers a failed stream command with `{"error": {"code", "message", "stream_id"}}`
and a 4xx status (`s2l_sglang/server/routes.py`), or, once a finish's events have started, with
an event `data: {"error": {...}}`. SGLang's `--api-key` middleware answers 401 with
`{"error": "Unauthorized"}`. Each code maps to one subclass of `StreamAPIError`; an unknown code
gives the base class with the code kept.
"""

from __future__ import annotations

from typing import Any

import orjson


class StreamAPIError(Exception):
    """A stream command the server refused; `code`, `status` and `stream_id` say why and where."""

    code: str = "stream_error"
    status: int | None = 400

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        stream_id: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.stream_id = stream_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r}, status={self.status})"


class UnknownStream(StreamAPIError):
    code, status = "unknown_stream", 404


class StreamClosed(StreamAPIError):
    """The stream was finished or aborted (by the client, an idle timeout or a failure)."""

    code, status = "stream_closed", 409


class DuplicateStream(StreamAPIError):
    code, status = "duplicate_stream", 409


class EmptyChunk(StreamAPIError):
    code, status = "empty_chunk", 400


class ContextTooLong(StreamAPIError):
    """The context outgrew the model; the server aborted the stream and freed its KV."""

    code, status = "context_too_long", 413


class MixedInput(StreamAPIError):
    """Text and token ids in one stream or one call: a stream takes one kind of chunk."""

    code, status = "mixed_input", 400


class InvalidTokenIds(StreamAPIError):
    """`input_ids` that are not a list of ids in the model's vocabulary."""

    code, status = "invalid_input_ids", 400


class BadRequest(StreamAPIError):
    code, status = "bad_request", 400


class PayloadTooLarge(StreamAPIError):
    code, status = "payload_too_large", 413


class InvalidSamplingParams(StreamAPIError):
    """Sampling parameters SGLang would refuse (checked at open and at finish)."""

    code, status = "invalid_sampling_params", 400


class InvalidStreamId(StreamAPIError):
    """A stream id with characters a route cannot address (allowed: A-Z a-z 0-9 . _ ~ -)."""

    code, status = "invalid_stream_id", 400


class ReaderStalled(StreamAPIError):
    """The finish's output was not read for the server's idle timeout: the stream was aborted."""

    code, status = "reader_stalled", 408


class EngineError(StreamAPIError):
    """The engine failed or refused a turn for a reason of its own (overload: 503)."""

    code, status = "engine_error", 500


class Forbidden(StreamAPIError):
    """403: a call on a stream without its token (the `stream_token` its open returned)."""

    code, status = "forbidden", 403


class Unauthorized(StreamAPIError):
    """401: a missing or wrong API key (SGLang's `--api-key`)."""

    code, status = "unauthorized", 401


ERRORS: dict[str, type[StreamAPIError]] = {
    cls.code: cls
    for cls in (
        UnknownStream,
        StreamClosed,
        DuplicateStream,
        EmptyChunk,
        ContextTooLong,
        MixedInput,
        InvalidTokenIds,
        BadRequest,
        PayloadTooLarge,
        InvalidSamplingParams,
        InvalidStreamId,
        ReaderStalled,
        EngineError,
        Forbidden,
        Unauthorized,
    )
}


def error_from_payload(
    payload: Any, status: int | None = None, stream_id: str | None = None
) -> StreamAPIError:
    """The typed error for a decoded error body (or an error event's data)."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        code = str(err.get("code") or "stream_error")
        message = str(err.get("message") or code)
        stream_id = err.get("stream_id") or stream_id
    elif status == 401:
        code, message = "unauthorized", str(err or "Unauthorized")
    else:
        code = f"http_{status}" if status else "stream_error"
        message = str(err or payload)
    cls = ERRORS.get(code, StreamAPIError)
    return cls(message, code=code, status=status, stream_id=stream_id)


#: how sglang-router in PD mode wraps a decode instance's error answer to a request with
#: `"stream": true`: `data: {'error': {"message": BODY, "status": N}}` (BODY: the JSON answer)
_PD_ERROR_EVENT = b"data: {'error': "


def _unwrap_pd_error(body: bytes) -> Any:
    """The error body a PD router's error event wraps, or None if `body` is not one."""
    if not body.startswith(_PD_ERROR_EVENT):
        return None
    try:
        inner = orjson.loads(body[len(_PD_ERROR_EVENT) :].strip()[:-1])
    except orjson.JSONDecodeError:
        return None
    return inner.get("message") if isinstance(inner, dict) else None


def error_from_response(status: int, body: bytes, stream_id: str | None = None) -> StreamAPIError:
    """The typed error for a non-2xx response with raw `body` (our error shape, also inside a
    PD router's error event)."""
    try:
        payload = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        payload = _unwrap_pd_error(body) or body.decode("utf-8", "replace")
    if status == 401 and not isinstance(payload, dict):
        payload = {"error": payload or "Unauthorized"}
    return error_from_payload(payload, status, stream_id)


def error_from_stream_error(exc: Exception) -> StreamAPIError:
    """The client-side error for an in-process engine's `s2l_sglang.stream.StreamError`."""
    code = getattr(exc, "code", "stream_error")
    cls = ERRORS.get(code, StreamAPIError)
    return cls(
        str(exc),
        code=code,
        status=getattr(exc, "status", None),
        stream_id=getattr(exc, "stream_id", None),
    )
