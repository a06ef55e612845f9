"""Async Python client of the stream routes (aiohttp, orjson).

    async with StreamClient("http://127.0.0.1:30000", api_key=KEY) as client:
        async with client.stream(sampling_params={"max_new_tokens": 64}) as stream:
            await stream.append("First retrieved page ... ")
            await stream.update(["a refined", "list of documents"])
            out = await stream.finish("\\nQuestion: ...\\nAnswer:")
        print(out["text"], out["meta_info"]["stream"]["ttft_s"])

A `Stream` opens on `async with` entry and, unless it was finished, is aborted on exit (its KV
freed at once rather than at the server's idle timeout). Every refused command raises a typed
`frontend.errors.StreamAPIError`. The client keeps each stream's token (its open's
`stream_token`) in `tokens` and sends it with every later call on that stream; the clients of
one process share that table unless given their own (`StreamClient(..., tokens={})`).

Every chunk is text or, with `input_ids=`, a list of token ids; one stream takes one kind
(mixing them is `MixedInput`). An agent loop finishes with `keep_open=True`: the stream then
stays open with its prompt and the generated tokens as a fixed history; later chunks (a tool's
result) go after them and the next finish generates again without recomputing the history:

    async with client.stream(sampling_params=params, text=question) as stream:
        first = await stream.finish(keep_open=True)             # the stream stays open
        await stream.append("\nTool result: " + tool(first["text"]) + "\n")
        second = await stream.finish("Answer:")                 # generates again, then closes

After a generating turn the server tokenizes later text on its own, after the generated ids; a
finish with nothing new since the last generation is refused (`EmptyChunk`). A stream whose
last finish kept it open is aborted on `async with` exit, like an unfinished one.
`StreamClient.connect` is the one-connection form (POST /stream): the commands go as
newline-delimited JSON in one streamed request body.

Behind sglang-router (`s2l serve --instances N`, docs/router.md), `StreamClient(router_url,
routed=True)` sends every command as the `/generate` request the router proxies, the stream id
as its routing key (header `x-smg-routing-key`) and the token in the body; a stream opened
without an id gets one here, since the key must be known at the first call. The one-connection
form is not carried by the router.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any

import aiohttp
import orjson

from frontend.errors import (
    StreamAPIError,
    StreamClosed,
    UnknownStream,
    error_from_payload,
    error_from_response,
)

JSON_HEADERS = {"Content-Type": "application/json"}
#: the header that carries a stream's token (the server's `stream/isolation.py`)
TOKEN_HEADER = "X-Stream-Token"
#: the header by which sglang-router's manual policy sends one key's requests to one instance
ROUTING_KEY_HEADER = "x-smg-routing-key"
#: stream id -> token of the streams this process's clients opened (shared by default: one
#: process is one principal; a client given `tokens=` keeps its own table)
_TOKENS: dict[str, str] = {}


async def _sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The `data:` payloads of a server-sent-event response, up to `data: [DONE]`."""
    buffer = b""
    async for piece in resp.content.iter_any():
        buffer += piece.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            lines = [ln[5:].lstrip(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if not lines:
                continue
            data = b"\n".join(lines)
            if data == b"[DONE]":
                return
            yield data


class StreamClient:
    """Client of one server's stream routes; owns its aiohttp session unless given one."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        session: aiohttp.ClientSession | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        tokens: dict[str, str] | None = None,
        routed: bool = False,
    ):
        self.base_url = base_url.rstrip("/")
        #: commands go as `/generate` requests routed by stream id (sglang-router in front)
        self.routed = routed
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = session
        self._owns_session = session is None
        #: stream id -> its token (the `stream_token` of its open; sent as X-Stream-Token):
        #: shared by this process's clients unless `tokens` is given. Set an entry to act on
        #: a stream another process opened.
        self.tokens: dict[str, str] = _TOKENS if tokens is None else tokens
        self._timeout = timeout or aiohttp.ClientTimeout(total=None, sock_connect=30)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session (created on first use, inside the caller's event loop)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
            self._owns_session = True
        return self._session

    async def close(self) -> None:
        if self._owns_session and self._session is not None and not self._session.closed:
            await self._session.close()

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stream(
        self,
        stream_id: str | None = None,
        sampling_params: dict | None = None,
        text: str = "",
        input_ids: list[int] | None = None,
    ) -> Stream:
        """A stream handle; `async with` opens it (with `text` or `input_ids` as its first
        chunk, if any)."""
        return Stream(self, stream_id, sampling_params, text, input_ids)

    # ---- one call per route -------------------------------------------------------------------

    async def command(self, op: str, body: dict[str, Any]) -> dict:
        """POST /stream/{op} with a JSON body (routed: the `/generate` form); the decoded
        answer, or a typed error."""
        url, data, headers = self._request(op, body)
        async with self.session.post(url, data=data, headers=headers) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise error_from_response(resp.status, raw, body.get("stream_id"))
            answer = orjson.loads(raw)
        if op == "open" and isinstance(answer, dict) and answer.get("stream_token"):
            self.tokens[answer["stream_id"]] = answer["stream_token"]
        elif op == "abort" or (op == "finish" and not body.get("keep_open")):
            self.tokens.pop(body.get("stream_id"), None)
        return answer

    def _request(self, op: str, body: dict[str, Any]) -> tuple[str, bytes, dict[str, str]]:
        """The URL, body and headers of command `op` on this client's server or router."""
        sid = body.get("stream_id")
        if not self.routed:
            headers = {**JSON_HEADERS, **self._headers(sid)}
            return f"{self.base_url}/stream/{op}", orjson.dumps(body), headers
        command = {"op": op, **body}
        token = self.tokens.get(sid) if sid is not None else None
        if token:
            command["stream_token"] = token
        headers = {**JSON_HEADERS, **self.headers, ROUTING_KEY_HEADER: str(sid)}
        # "stream": true at the top level, for every command: sglang-router buffers an answer
        # whole unless the body it forwards says so (a finish's events then reach the client
        # as they are produced), and in PD mode it keeps our error body only so (inside an
        # error event; without it, just the status and message). The server ignores the field.
        outer: dict[str, Any] = {"session_params": {"s2l": command}, "stream": True}
        return f"{self.base_url}/generate", orjson.dumps(outer), headers

    def _headers(self, stream_id: str | None) -> dict[str, str]:
        """The API key, and the stream's token where this client has it."""
        token = self.tokens.get(stream_id) if stream_id is not None else None
        return {**self.headers, TOKEN_HEADER: token} if token else dict(self.headers)

    async def open(
        self,
        stream_id: str | None = None,
        sampling_params: dict | None = None,
        text: str = "",
        input_ids: list[int] | None = None,
    ) -> dict:
        """Open a stream, with `text` or `input_ids` as an optional first chunk; its status."""
        if stream_id is None and self.routed:  # the routing key is needed at this first call
            stream_id = uuid.uuid4().hex
        body = _chunk_body(stream_id, text, input_ids)
        if sampling_params is not None:
            body["sampling_params"] = sampling_params
        return await self.command("open", body)

    async def append(
        self, stream_id: str, text: str = "", input_ids: list[int] | None = None
    ) -> dict:
        """Add a chunk, `text` or `input_ids`, at the end of the context."""
        return await self.command("append", _chunk_body(stream_id, text, input_ids))

    async def update(
        self, stream_id: str, text: str | list[str] = "", input_ids: list[int] | None = None
    ) -> dict:
        """Replace the context (after the history, once a finish kept the stream open): a
        string, documents the server joins with a blank line, or `input_ids`."""
        if isinstance(text, str):
            body = _chunk_body(stream_id, text, input_ids)
        else:
            body = {**_chunk_body(stream_id, "", input_ids), "documents": text}
        return await self.command("update", body)

    async def finish(
        self,
        stream_id: str,
        text: str = "",
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        keep_open: bool = False,
    ) -> dict:
        """Generate, with an optional last chunk, and return the final output (one JSON answer,
        no events). `keep_open`: the stream stays open afterwards (an agent loop)."""
        body = self._finish_body(
            stream_id, text, sampling_params, input_ids, keep_open, stream=False
        )
        return await self.command("finish", body)

    async def finish_iter(
        self,
        stream_id: str,
        text: str = "",
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        keep_open: bool = False,
    ) -> AsyncIterator[dict]:
        """Like `finish`, yielding the outputs as they stream (the last has TTFT)."""
        body = self._finish_body(
            stream_id, text, sampling_params, input_ids, keep_open, stream=True
        )
        url, data, headers = self._request("finish", body)
        async with self.session.post(url, data=data, headers=headers) as resp:
            async for out in self._events(resp, stream_id):
                yield out
        if not keep_open:
            self.tokens.pop(stream_id, None)

    async def abort(self, stream_id: str) -> dict:
        return await self.command("abort", {"stream_id": stream_id})

    async def status(self, stream_id: str) -> dict:
        """The stream's status; `StreamClosed` once it was finished or aborted."""
        if self.routed:
            return await self.command("status", {"stream_id": stream_id})
        async with self.session.get(
            f"{self.base_url}/stream/{stream_id}", headers=self._headers(stream_id)
        ) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise error_from_response(resp.status, raw, stream_id)
            return orjson.loads(raw)

    async def connect(self, commands: Iterable[dict] | AsyncIterable[dict]) -> AsyncIterator[dict]:
        """One connection per stream (POST /stream): send `commands` as they come, yield outputs.

        `commands` are route bodies with an "op": {"op": "open", ...}, then "append"/"update"
        commands, then {"op": "finish", ...}; the request body streams while they are produced,
        so an async iterable can pace them. Yields the finish's outputs like `finish_iter`.
        Not carried by sglang-router (a `routed` client raises ValueError).
        """
        if self.routed:
            raise ValueError("the one-connection form is not carried by sglang-router")

        async def body() -> AsyncIterator[bytes]:
            if isinstance(commands, AsyncIterable):
                async for cmd in commands:
                    yield orjson.dumps(cmd) + b"\n"
            else:
                for cmd in commands:
                    yield orjson.dumps(cmd) + b"\n"

        async with self.session.post(
            f"{self.base_url}/stream",
            data=body(),
            headers={"Content-Type": "application/x-ndjson", **self.headers},
        ) as resp:
            async for out in self._events(resp, None):
                yield out

    # ---- internals ----------------------------------------------------------------------------

    @staticmethod
    def _finish_body(
        stream_id: str,
        text: str,
        sampling_params: dict | None,
        input_ids: list[int] | None,
        keep_open: bool,
        stream: bool,
    ) -> dict[str, Any]:
        body = _chunk_body(stream_id, text, input_ids)
        body["stream"] = stream
        if keep_open:
            body["keep_open"] = True
        if sampling_params is not None:
            body["sampling_params"] = sampling_params
        return body

    @staticmethod
    async def _events(resp: aiohttp.ClientResponse, stream_id: str | None) -> AsyncIterator[dict]:
        if resp.status != 200:
            raise error_from_response(resp.status, await resp.read(), stream_id)
        async for data in _sse_data(resp):
            out = orjson.loads(data)
            if "error" in out:
                raise error_from_payload(out, None, stream_id)
            yield out


def _chunk_body(stream_id: str | None, text: str, input_ids: list[int] | None) -> dict[str, Any]:
    """A command's body with its chunk: "input_ids" when given (and "text" only if non-empty,
    so that the server can refuse the mix), else "text"."""
    body: dict[str, Any] = {} if stream_id is None else {"stream_id": stream_id}
    if input_ids is None or text:
        body["text"] = text
    if input_ids is not None:
        body["input_ids"] = input_ids
    return body


class Stream:
    """One stream on the server: opened on `async with` entry, aborted on exit unless its last
    finish closed it (a finish with `keep_open=True` leaves it open and usable)."""

    def __init__(
        self,
        client: StreamClient,
        stream_id: str | None = None,
        sampling_params: dict | None = None,
        text: str = "",
        input_ids: list[int] | None = None,
    ):
        self.client = client
        self.stream_id = stream_id
        self.sampling_params = sampling_params
        self.first_text = text
        self.first_ids = input_ids
        self.opened = False
        self.closed = False  # finished (not kept open) or aborted by this handle
        self.generations = 0  # finishes that produced an output, kept open or not

    async def __aenter__(self) -> Stream:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.opened and not self.closed:
            try:
                await self.abort()
            except (StreamClosed, UnknownStream):
                pass  # the server already ended it (a failed finish, an idle timeout)

    async def open(self) -> dict:
        status = await self.client.open(
            self.stream_id, self.sampling_params, self.first_text, self.first_ids
        )
        self.stream_id = status["stream_id"]
        self.opened = True
        return status

    async def append(self, text: str = "", input_ids: list[int] | None = None) -> dict:
        return await self.client.append(self._sid(), text, input_ids)

    async def update(self, text: str | list[str] = "", input_ids: list[int] | None = None) -> dict:
        return await self.client.update(self._sid(), text, input_ids)

    async def finish(
        self,
        text: str = "",
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        keep_open: bool = False,
    ) -> dict:
        """The output (`meta_info["stream"]` has `ttft_s`, `kept_open` and the counters).

        `keep_open`: the stream stays open, its prompt and output a fixed history; append the
        next input (a tool's result) and finish again."""
        out = await self.client.finish(self._sid(), text, sampling_params, input_ids, keep_open)
        self._finished(keep_open)
        return out

    async def finish_iter(
        self,
        text: str = "",
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        keep_open: bool = False,
    ) -> AsyncIterator[dict]:
        """The outputs as they stream; SGLang's cumulative `text`, the last with TTFT."""
        outputs = self.client.finish_iter(self._sid(), text, sampling_params, input_ids, keep_open)
        async for out in outputs:
            yield out
        self._finished(keep_open)

    def _finished(self, keep_open: bool) -> None:
        self.generations += 1
        self.closed = not keep_open

    async def abort(self) -> None:
        self.closed = True
        await self.client.abort(self._sid())

    async def status(self) -> dict:
        return await self.client.status(self._sid())

    def _sid(self) -> str:
        if self.stream_id is None:
            raise StreamAPIError("the stream is not open yet", code="not_open", status=None)
        return self.stream_id
