"""Where a benchmark sends its requests: the in-process engine or a running HTTP server.

Both backends offer the same async calls, each made on the loop the replay runs on (`run`):
plain SGLang requests (`generate`, optionally a turn of an SGLang session), SGLang sessions,
our streams, cache flushes and the scheduler's counters. Outputs are SGLang's output dicts.
`switch_policy` (sync, from the caller's thread) changes the scheduler's stream policy at run
time where the engine or server can (`can_switch_policy`); `switch_publish` its
`publish_at_close` (the in-process engine only: `can_switch_publish`).

- `EngineBackend`: a `StreamEngine`; the replay runs on the engine's own event loop, where
  SGLang's tokenizer manager and our `StreamManager` live (no HTTP, no extra thread hops).
- `HttpBackend`: `s2l serve` (SGLang's /generate, /open_session, /close_session, /flush_cache,
  /abort_request, /server_info, /stream/policy, and our /stream routes through
  `frontend.client`), the router of `s2l serve --instances N` (stream commands in the
  `/generate` form the router proxies, routed by stream id), or the router of `s2l serve --pd`
  (the same form: the decode instance relays a command to its prefill instance).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from s2l_sglang.stream.engine import sched_counters_from

T = TypeVar("T")
SESSION_CAPACITY = 1 << 30


class Backend(Protocol):
    target: str  # "engine" | "http"

    def run(self, coro: Awaitable[T]) -> T: ...
    def encode(self, text: str) -> list[int]: ...
    def generate(
        self, input_ids: list[int], params: dict, rid: str, session_id: str | None = None
    ) -> AsyncIterator[dict]: ...
    async def abort_request(self, rid: str) -> None: ...
    async def open_session(self, sid: str) -> None: ...
    async def close_session(self, sid: str) -> None: ...
    async def stream_open(self, sid: str, params: dict, text: str) -> None: ...
    async def stream_append(self, sid: str, text: str) -> None: ...
    async def stream_update(self, sid: str, text: str) -> None: ...
    def stream_finish(self, sid: str, text: str) -> AsyncIterator[dict]: ...
    async def stream_abort(self, sid: str) -> None: ...
    async def flush(self) -> bool: ...
    async def sched_counters(self) -> dict | None: ...
    def can_switch_policy(self) -> bool: ...
    def switch_policy(self, name: str) -> None: ...
    def can_switch_publish(self) -> bool: ...
    def switch_publish(self, on: bool) -> None: ...


async def _retry_flush(flush_once: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    """Flush the prefix cache; SGLang refuses while requests are pending, so retry until idle."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if await flush_once():
            return True
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.2)


class EngineBackend:
    """A `StreamEngine` (in process)."""

    target = "engine"

    def __init__(self, engine: Any):
        self.engine = engine
        self.tm = engine.engine.tokenizer_manager
        self.streams = engine.streams
        self.tokenizer = engine.tokenizer

    def run(self, coro: Awaitable[T]) -> T:
        return self.engine._call(coro)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def generate(
        self, input_ids: list[int], params: dict, rid: str, session_id: str | None = None
    ) -> AsyncIterator[dict]:
        from sglang.srt.managers.io_struct import GenerateReqInput

        obj = GenerateReqInput(
            input_ids=input_ids,
            sampling_params=params,
            rid=rid,
            stream=True,
            session_params={"id": session_id} if session_id else None,
        )
        async for out in self.tm.generate_request(obj, None):
            yield out

    async def abort_request(self, rid: str) -> None:
        self.tm.abort_request(rid=rid)

    async def open_session(self, sid: str) -> None:
        from sglang.srt.managers.io_struct import OpenSessionReqInput

        req = OpenSessionReqInput(
            capacity_of_str_len=SESSION_CAPACITY, session_id=sid, streaming=True
        )
        if await self.tm.open_session(req) is None:
            raise RuntimeError(f"SGLang refused to open session {sid!r}")

    async def close_session(self, sid: str) -> None:
        from sglang.srt.managers.io_struct import CloseSessionReqInput

        await self.tm.close_session(CloseSessionReqInput(session_id=sid))

    async def stream_open(self, sid: str, params: dict, text: str) -> None:
        await self.streams.open(sid, params, text)

    async def stream_append(self, sid: str, text: str) -> None:
        await self.streams.append(sid, text)

    async def stream_update(self, sid: str, text: str) -> None:
        await self.streams.update(sid, text)

    async def stream_finish(self, sid: str, text: str) -> AsyncIterator[dict]:
        async for out in await self.streams.finish(sid, text):
            yield out

    async def stream_abort(self, sid: str) -> None:
        if sid in self.streams.streams:
            await self.streams.abort(sid)

    async def flush(self, timeout: float = 60.0) -> bool:
        """SGLang's deferred flush: it waits for the engine to go idle, at most `timeout` s."""
        return bool((await self.tm.flush_cache(timeout_s=timeout)).success)

    async def sched_counters(self) -> dict | None:
        """The scheduler's stream counters, if the plugin exports them (`s2l_sched`)."""
        states = await self.tm.get_internal_state()
        return sched_counters_from(states)

    def can_switch_policy(self) -> bool:
        return hasattr(self.engine, "set_stream_policy")

    def switch_policy(self, name: str) -> None:
        """Set the scheduler's stream policy; returns once the scheduler reports it."""
        self.engine.set_stream_policy(name)

    def can_switch_publish(self) -> bool:
        return hasattr(self.engine, "set_publish_at_close")

    def switch_publish(self, on: bool) -> None:
        """Set the scheduler's `publish_at_close`; returns once the scheduler reports it."""
        self.engine.set_publish_at_close(on)


class HttpBackend:
    """A running `s2l serve` at `url` (the tokenizer must be the server model's)."""

    target = "http"

    def __init__(self, url: str, tokenizer: Any, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.api_key = api_key
        self.loop = asyncio.new_event_loop()
        self._session = None
        self._client = None
        self._can_switch: bool | None = None

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        if self._session is not None:
            self.loop.run_until_complete(self._session.close())
        self.loop.close()

    @property
    def session(self):  # aiohttp.ClientSession, made inside the loop on first use
        import aiohttp

        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
            connector = aiohttp.TCPConnector(limit=0)
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self._session

    async def streams(self):
        """The `frontend.client.StreamClient` of the /stream routes (sharing the session).

        They are on the server itself; behind sglang-router (`s2l serve --instances N`, or the
        PD router of `s2l serve --pd`) they go through it in the `/generate` form
        (docs/router.md, docs/pd.md). Plain requests always go to `url`.
        """
        from frontend.client import StreamClient

        if self._client is None:
            routed = bool(await self._router_workers())
            self._client = StreamClient(
                self.url, api_key=self.api_key, session=self.session, routed=routed
            )
        return self._client

    async def _router_workers(self) -> list[dict]:
        """The workers of an sglang-router at `url` (its /workers), or [] for a plain server."""
        import orjson

        async with self.session.get(self.url + "/workers", headers=self.headers) as resp:
            if resp.status != 200:
                return []
            try:
                workers = orjson.loads(await resp.read()).get("workers", [])
            except (orjson.JSONDecodeError, AttributeError):
                return []
        return workers if isinstance(workers, list) else []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def _post(self, path: str, body: dict) -> tuple[int, Any]:
        import orjson

        async with self.session.post(
            self.url + path, data=orjson.dumps(body), headers=self._json_headers
        ) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                return resp.status, raw.decode(errors="replace")

    @property
    def _json_headers(self) -> dict:
        return {"Content-Type": "application/json", **self.headers}

    async def generate(
        self, input_ids: list[int], params: dict, rid: str, session_id: str | None = None
    ) -> AsyncIterator[dict]:
        import orjson

        from frontend.client import _sse_data

        body: dict[str, Any] = {
            "input_ids": input_ids,
            "sampling_params": params,
            "rid": rid,
            "stream": True,
        }
        if session_id:
            body["session_params"] = {"id": session_id}
        async with self.session.post(
            self.url + "/generate", data=orjson.dumps(body), headers=self._json_headers
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"/generate: HTTP {resp.status}: {(await resp.read())[:300]!r}")
            async for data in _sse_data(resp):
                out = orjson.loads(data)
                if "error" in out:
                    raise RuntimeError(f"/generate: {out['error']}")
                yield out

    async def abort_request(self, rid: str) -> None:
        await self._post("/abort_request", {"rid": rid})

    async def open_session(self, sid: str) -> None:
        body = {"capacity_of_str_len": SESSION_CAPACITY, "session_id": sid, "streaming": True}
        status, answer = await self._post("/open_session", body)
        if status != 200:
            raise RuntimeError(f"/open_session: HTTP {status}: {answer}")

    async def close_session(self, sid: str) -> None:
        await self._post("/close_session", {"session_id": sid})

    async def stream_open(self, sid: str, params: dict, text: str) -> None:
        await (await self.streams()).open(sid, params, text)

    async def stream_append(self, sid: str, text: str) -> None:
        await (await self.streams()).append(sid, text)

    async def stream_update(self, sid: str, text: str) -> None:
        await (await self.streams()).update(sid, text)

    async def stream_finish(self, sid: str, text: str) -> AsyncIterator[dict]:
        async for out in (await self.streams()).finish_iter(sid, text):
            yield out

    async def stream_abort(self, sid: str) -> None:
        from frontend.errors import StreamAPIError

        try:
            await (await self.streams()).abort(sid)
        except StreamAPIError:
            pass  # already ended

    async def flush(self, timeout: float = 60.0) -> bool:
        async def once() -> bool:
            status, _ = await self._post("/flush_cache", {})
            return status == 200

        return await _retry_flush(once, timeout)

    async def sched_counters(self) -> dict | None:
        """From SGLang's /server_info: its `internal_states` list holds one dict per scheduler
        (data-parallel rank), the plugin's counters under `s2l_sched`."""
        import orjson

        async with self.session.get(self.url + "/server_info", headers=self.headers) as resp:
            if resp.status != 200:
                return None
            info = orjson.loads(await resp.read())
        return sched_counters_from(info.get("internal_states"))

    def can_switch_policy(self) -> bool:
        """Whether the server has `POST /stream/policy` (asked once, by switching to the
        policy it already has)."""
        if self._can_switch is None:
            counters = self.run(self.sched_counters()) or {}
            current = counters.get("policy")
            if current is None:
                self._can_switch = False
            else:
                status, _ = self.run(self._post("/stream/policy", {"policy": current}))
                self._can_switch = status == 200
        return self._can_switch

    def switch_policy(self, name: str) -> None:
        status, answer = self.run(self._post("/stream/policy", {"policy": name}))
        if status != 200:
            raise RuntimeError(f"/stream/policy {name!r}: HTTP {status}: {answer}")

    def can_switch_publish(self) -> bool:
        return False  # no HTTP route: `s2l serve --no-stream-publish-at-close` sets it per server

    def switch_publish(self, on: bool) -> None:
        raise RuntimeError("a server's publish_at_close cannot be switched at run time")
