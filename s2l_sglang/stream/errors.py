"""Typed stream errors; each carries an HTTP status for the HTTP routes."""

from __future__ import annotations


class StreamError(Exception):
    """A request about a stream that cannot be served; nothing else is affected."""

    status: int = 400
    code: str = "stream_error"

    def __init__(self, message: str, stream_id: str | None = None):
        super().__init__(message)
        self.stream_id = stream_id

    def to_dict(self) -> dict:
        return {"error": {"code": self.code, "message": str(self), "stream_id": self.stream_id}}


class UnknownStream(StreamError):
    status, code = 404, "unknown_stream"


class DuplicateStream(StreamError):
    status, code = 409, "duplicate_stream"


class StreamClosed(StreamError):
    """The stream was finished or aborted: no more chunks, updates or finish."""

    status, code = 409, "stream_closed"


class EmptyChunk(StreamError):
    status, code = 400, "empty_chunk"


class ContextTooLong(StreamError):
    """The context outgrew the model's length; the stream is aborted and its KV freed."""

    status, code = 413, "context_too_long"


class MixedInput(StreamError):
    """Text and token ids in one stream (or in one call): a stream takes one kind of chunk."""

    status, code = 400, "mixed_input"


class InvalidTokenIds(StreamError):
    """`input_ids` that are not a list of ids in the model's vocabulary."""

    status, code = 400, "invalid_input_ids"


class NotAChatStream(StreamError):
    """A chat-only call (the OpenAI-shaped finish) on a stream opened without messages."""

    status, code = 400, "not_a_chat_stream"


class ChatStreamCall(StreamError):
    """A call a chat stream does not take (token ids, the plain finish, sampling parameters)."""

    status, code = 400, "chat_stream"


class InvalidMessages(StreamError):
    status, code = 400, "invalid_messages"


class Forbidden(StreamError):
    """An HTTP call on a stream without the stream's token (stream/isolation.py)."""

    status, code = 403, "forbidden"


class InvalidSamplingParams(StreamError):
    """Sampling parameters SGLang would refuse (checked at open and at finish)."""

    status, code = 400, "invalid_sampling_params"


class InvalidStreamId(StreamError):
    """A stream id every route cannot address (see `manager.STREAM_ID`)."""

    status, code = 400, "invalid_stream_id"


class ReaderStalled(StreamError):
    """The finish's reader took no output for the idle timeout: the stream was aborted."""

    status, code = 408, "reader_stalled"


class EngineError(StreamError):
    """The engine refused or failed a turn for a reason of its own (overload, a timeout, an
    internal error); `status` is the engine's own where it gave one (SGLang's 503s)."""

    status, code = 500, "engine_error"


def engine_error(exc: BaseException, sid: str | None) -> StreamError:
    """A typed stream error for an exception raised by SGLang during a turn."""
    if isinstance(exc, StreamError):
        exc.stream_id = sid  # raised below the manager, it may name the internal session key
        return exc
    if isinstance(exc, ValueError):  # SGLang's validation errors (e.g. a context too long)
        return StreamError(str(exc), sid)
    err = EngineError(f"{type(exc).__name__}: {getattr(exc, 'detail', None) or exc}", sid)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status < 600:
        err.status = status
    return err
