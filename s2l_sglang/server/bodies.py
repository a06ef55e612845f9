"""Typed bodies of the stream routes (pydantic, as FastAPI's own), and their OpenAPI schemas.

Each route reads its raw body (the size limit comes first: `--max-stream-body-bytes`) and
validates it here. Validation is strict: a field of the wrong type, an unknown field, a token
id that is not an integer all get a 400 `bad_request` that names the field, before the stream
manager is called. Sampling parameters are a JSON object here; their content is checked with
SGLang's own class by the manager (stream/params.py), also before any engine work.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from s2l_sglang.stream.errors import StreamError

#: the stream-id rule, as the manager applies it (manager.STREAM_ID), for the schemas
STREAM_ID_PATTERN = r"^[A-Za-z0-9._~-]{1,128}$"


class BadRequest(StreamError):
    status, code = 400, "bad_request"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class OpenBody(_Body):
    stream_id: str | None = Field(None, description="default: a fresh uuid4 hex")
    sampling_params: dict[str, Any] | None = None
    text: str = ""
    input_ids: list[int] | None = None
    # a chat stream
    messages: list[dict[str, Any]] | None = None
    context_message: int | None = Field(None, description="index of the streamed message")


class AppendBody(_Body):
    stream_id: str
    text: str = ""
    input_ids: list[int] | None = None


class UpdateBody(_Body):
    stream_id: str
    text: str = ""
    documents: list[str] | None = Field(None, description="joined by blank lines")
    input_ids: list[int] | None = None


class FinishBody(_Body):
    stream_id: str
    text: str = ""
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    stream: bool = Field(True, description="server-sent events; false: one JSON object")
    keep_open: bool = False


class AbortBody(_Body):
    stream_id: str


class PolicyBody(_Body):
    policy: str


BODIES: dict[str, type[_Body]] = {
    "open": OpenBody,
    "append": AppendBody,
    "update": UpdateBody,
    "finish": FinishBody,
    "abort": AbortBody,
    "policy": PolicyBody,
}

OPS = ("open", "append", "update", "finish", "abort")


class CommandLine(_Body):
    """One line of the one-connection route (`POST /stream`): an op and its fields (the stream
    id comes from the connection's open)."""

    model_config = ConfigDict(extra="allow", strict=True)
    op: Literal["open", "append", "update", "finish"]


class RoutedCommand(_Body):
    """A stream command carried by a `/generate` request (`session_params.s2l`, server/routed.py):
    an op, the stream's token and the fields of the op's route."""

    model_config = ConfigDict(extra="allow", strict=True)
    op: Literal["open", "append", "update", "finish", "abort", "status"]
    stream_id: str
    stream_token: str | None = None


def parse_body(kind: str, body: Any) -> _Body:
    """`body` (parsed JSON) validated as route `kind`'s body; BadRequest naming the field."""
    stream_id = body.get("stream_id") if isinstance(body, dict) else None
    try:
        return BODIES[kind].model_validate(body)
    except ValidationError as exc:
        raise BadRequest(
            _describe(exc), stream_id if isinstance(stream_id, str) else None
        ) from None


def parse_command(body: Any, kind: type[_Body] = CommandLine) -> tuple[str, dict]:
    """A line of `POST /stream` (or, with `kind=RoutedCommand`, a command carried by
    `/generate`): its op and the rest of its fields."""
    try:
        line = kind.model_validate(body)
    except ValidationError as exc:
        sid = body.get("stream_id") if isinstance(body, dict) else None
        raise BadRequest(_describe(exc), sid if isinstance(sid, str) else None) from None
    rest = dict(body)
    rest.pop("op")
    return line.op, rest


def _describe(exc: ValidationError) -> str:
    """The first error of a validation, as one line: "field 'text': Input should be ..."."""
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    if first.get("type") == "extra_forbidden":
        return f"unknown field {where!r}"
    if first.get("type") == "missing":
        return f"missing field {where!r}"
    if not where:
        return f"the request body must be a JSON object ({first.get('msg', '')})"
    return f"field {where!r}: {first.get('msg', 'invalid')}"


def openapi_body(kind: str) -> dict:
    """`openapi_extra` for a route whose body is route `kind`'s (FastAPI cannot see it: the
    route reads the raw body)."""
    schema = BODIES[kind].model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
