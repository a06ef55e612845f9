"""Async Python client of the stream routes (aiohttp, orjson).

    async with StreamClient("http://127.0.0.1:30000", api_key=KEY) as client:
        async with client.stream(sampling_params={"max_new_tokens": 64}) as stream:
            await stream.append("First retrieved page ... ")
            await stream.update(["a refined", "list of documents"])
            out = await stream.finish("\\nQuestion: ...\\nAnswer:")
        print(out["text"], out["meta_info"]["stream"]["ttft_s"])

A `Stream` opens on `async with` entry and, unless it was finished, is aborted on exit (its KV
freed at once rather than at the server's idle timeout). Every refused command raises a typed
`frontend.errors.StreamAPIError`. `StreamClient.connect` is the one-connection form (POST
/stream): the commands go as newline-delimited JSON in one streamed request body.
"""

from __future__ import annotations

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
    ):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = session
        self._owns_session = session is None
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
    ) -> Stream:
        """A stream handle; `async with` opens it (with `text` as its first chunk, if any)."""
        return Stream(self, stream_id, sampling_params, text)

    # ---- one call per route -------------------------------------------------------------------

    async def command(self, op: str, body: dict[str, Any]) -> dict:
        """POST /stream/{op} with a JSON body; the decoded answer, or a typed error."""
        async with self.session.post(
            f"{self.base_url}/stream/{op}",
            data=orjson.dumps(body),
            headers={**JSON_HEADERS, **self.headers},
        ) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise error_from_response(resp.status, raw, body.get("stream_id"))
            return orjson.loads(raw)

    async def open(
        self, stream_id: str | None = None, sampling_params: dict | None = None, text: str = ""
    ) -> dict:
        body: dict[str, Any] = {"text": text}
        if stream_id is not None:
            body["stream_id"] = stream_id
        if sampling_params is not None:
            body["sampling_params"] = sampling_params
        return await self.command("open", body)

    async def append(self, stream_id: str, text: str) -> dict:
        return await self.command("append", {"stream_id": stream_id, "text": text})

    async def update(self, stream_id: str, text: str | list[str]) -> dict:
        """Replace the context: a string, or documents the server joins with a blank line."""
        key = "text" if isinstance(text, str) else "documents"
        return await self.command("update", {"stream_id": stream_id, key: text})

    async def finish(
        self, stream_id: str, text: str = "", sampling_params: dict | None = None
    ) -> dict:
        """Finish the stream and return its final output (one JSON answer, no events)."""
        body = self._finish_body(stream_id, text, sampling_params, stream=False)
        return await self.command("finish", body)

    async def finish_iter(
        self, stream_id: str, text: str = "", sampling_params: dict | None = None
    ) -> AsyncIterator[dict]:
        """Finish the stream and yield its outputs as they stream (the last has TTFT)."""
        body = self._finish_body(stream_id, text, sampling_params, stream=True)
        async with self.session.post(
            f"{self.base_url}/stream/finish",
            data=orjson.dumps(body),
            headers={**JSON_HEADERS, **self.headers},
        ) as resp:
            async for out in self._events(resp, stream_id):
                yield out

    async def abort(self, stream_id: str) -> dict:
        return await self.command("abort", {"stream_id": stream_id})

    async def status(self, stream_id: str) -> dict:
        """The stream's status; `StreamClosed` once it was finished or aborted."""
        async with self.session.get(
            f"{self.base_url}/stream/{stream_id}", headers=self.headers
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
        """

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
        stream_id: str, text: str, sampling_params: dict | None, stream: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"stream_id": stream_id, "text": text, "stream": stream}
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


class Stream:
    """One stream on the server: opened on `async with` entry, aborted on exit if not finished."""

    def __init__(
        self,
        client: StreamClient,
        stream_id: str | None = None,
        sampling_params: dict | None = None,
        text: str = "",
    ):
        self.client = client
        self.stream_id = stream_id
        self.sampling_params = sampling_params
        self.first_text = text
        self.opened = False
        self.closed = False  # finished or aborted by this handle

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
        status = await self.client.open(self.stream_id, self.sampling_params, self.first_text)
        self.stream_id = status["stream_id"]
        self.opened = True
        return status

    async def append(self, text: str) -> dict:
        return await self.client.append(self._sid(), text)

    async def update(self, text: str | list[str]) -> dict:
        return await self.client.update(self._sid(), text)

    async def finish(self, text: str = "", sampling_params: dict | None = None) -> dict:
        """The final output (`meta_info["stream"]` has `ttft_s` and the stream's counters)."""
        out = await self.client.finish(self._sid(), text, sampling_params)
        self.closed = True
        return out

    async def finish_iter(
        self, text: str = "", sampling_params: dict | None = None
    ) -> AsyncIterator[dict]:
        """The outputs as they stream; SGLang's cumulative `text`, the last with TTFT."""
        async for out in self.client.finish_iter(self._sid(), text, sampling_params):
            yield out
        self.closed = True

    async def abort(self) -> None:
        self.closed = True
        await self.client.abort(self._sid())

    async def status(self) -> dict:
        return await self.client.status(self._sid())

    def _sid(self) -> str:
        if self.stream_id is None:
            raise StreamAPIError("the stream is not open yet", code="not_open", status=None)
        return self.stream_id
