"""`StreamEngine`: SGLang's in-process `Engine` with streaming-context requests (sync and async).

The engine's event loop (where SGLang's tokenizer manager lives) runs in a background thread, so
a stream keeps prefilling between the caller's calls. Sync methods block until their operation is
accepted (not until its prefill is done); async methods can be awaited from any event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from s2l_sglang.stream.manager import StreamManager


class StreamEngine:
    """An SGLang engine (embedded model and CPU defaults unless overridden) plus streams."""

    def __init__(
        self,
        idle_timeout: float | None = 60.0,
        stream_policy: str | None = None,
        preemption: str | None = None,
        host_kv_tokens: int | None = None,
        **engine_kwargs: Any,
    ):
        """`stream_policy`: the scheduler's stream policy (`default`, `fcfs`, `lcas`, `mcps`;
        default: env `S2L_STREAM_POLICY`, else `default`). `preemption`: how streams give up
        KV under pressure (`auto`, `recompute`, `swap`; default: env `S2L_PREEMPTION`, else
        `auto`: by the saved cost profile of this setup, recompute if none). `host_kv_tokens`:
        the host pool for swapped KV (default: the device pool's size). Other arguments go to
        `sgl.Engine`."""
        import os

        import sglang as sgl

        from s2l_sglang.defaults import engine_kwargs as default_kwargs
        from s2l_sglang.sched.policy import get_policy

        if stream_policy is not None:
            get_policy(stream_policy)  # a clear error for an unknown name
            os.environ["S2L_STREAM_POLICY"] = stream_policy  # read by the scheduler process
        if preemption is not None:
            from s2l_sglang.sched.preemption import preemption_names

            if preemption not in preemption_names():
                raise ValueError(f"preemption: choose one of {preemption_names()}")
            os.environ["S2L_PREEMPTION"] = preemption
        if host_kv_tokens is not None:
            os.environ["S2L_HOST_KV_TOKENS"] = str(int(host_kv_tokens))

        self.engine = sgl.Engine(**default_kwargs(**engine_kwargs))
        tm = self.engine.tokenizer_manager
        self.tokenizer = tm.tokenizer
        self.loop = self.engine.loop
        self.streams = StreamManager(
            tm, page_size=self.engine.server_args.page_size or 1, idle_timeout=idle_timeout
        )
        self._thread = threading.Thread(target=self._run_loop, name="s2l-engine-loop", daemon=True)
        self._thread.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    # ---- plumbing ---------------------------------------------------------------------------

    def _call(self, coro: Awaitable) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _acall(self, coro: Awaitable) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def _collect(self, agen_coro: Awaitable[AsyncIterator[dict]]) -> dict:
        last: dict = {}
        async for out in await agen_coro:
            last = out
        return last

    # ---- plain requests (the non-streaming reference) ----------------------------------------

    async def _generate(self, **kwargs: Any) -> dict:
        from sglang.srt.managers.io_struct import GenerateReqInput

        out: dict = {}
        async for item in self.engine.tokenizer_manager.generate_request(
            GenerateReqInput(**kwargs), None
        ):
            out = item
        return out

    def generate(
        self,
        prompt: str | None = None,
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
    ) -> dict:
        """A plain (non-streaming) SGLang request."""
        return self._call(
            self._generate(text=prompt, input_ids=input_ids, sampling_params=sampling_params or {})
        )

    async def async_generate(
        self,
        prompt: str | None = None,
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
    ) -> dict:
        return await self._acall(
            self._generate(text=prompt, input_ids=input_ids, sampling_params=sampling_params or {})
        )

    # ---- streams: sync ----------------------------------------------------------------------

    def open_stream(self, sid: str, sampling_params: dict | None = None, text: str = "") -> dict:
        return self._call(self.streams.open(sid, sampling_params, text))

    def append(self, sid: str, text: str) -> dict:
        return self._call(self.streams.append(sid, text))

    def update(self, sid: str, text: str) -> dict:
        return self._call(self.streams.update(sid, text))

    def finish(self, sid: str, text: str = "", sampling_params: dict | None = None) -> dict:
        """Finish the stream and return its final output (`meta_info["stream"]` has TTFT)."""
        return self._call(self._collect(self.streams.finish(sid, text, sampling_params)))

    def abort(self, sid: str) -> None:
        self._call(self.streams.abort(sid))

    def status(self, sid: str) -> dict:
        return self._call(self._status(sid))

    async def _status(self, sid: str) -> dict:
        return self.streams.status(sid)

    # ---- streams: async ---------------------------------------------------------------------

    async def async_open_stream(
        self, sid: str, sampling_params: dict | None = None, text: str = ""
    ) -> dict:
        return await self._acall(self.streams.open(sid, sampling_params, text))

    async def async_append(self, sid: str, text: str) -> dict:
        return await self._acall(self.streams.append(sid, text))

    async def async_update(self, sid: str, text: str) -> dict:
        return await self._acall(self.streams.update(sid, text))

    async def async_finish(
        self, sid: str, text: str = "", sampling_params: dict | None = None
    ) -> dict:
        return await self._acall(self._collect(self.streams.finish(sid, text, sampling_params)))

    async def async_abort(self, sid: str) -> None:
        await self._acall(self.streams.abort(sid))

    # ---- engine state -----------------------------------------------------------------------

    def flush_cache(self) -> bool:
        """Empty SGLang's prefix cache (refused by SGLang while requests run)."""
        return bool(self._call(self.engine.tokenizer_manager.flush_cache()).success)

    def sched_counters(self) -> dict[str, int]:
        """The scheduler's stream counters (policy, preemptions by mode, tokens swapped ...)."""
        states = self._call(self.engine.tokenizer_manager.get_internal_state())
        return sched_counters_from(states) or {}

    # ---- lifecycle --------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the engine. SGLang's `Engine.shutdown` kills every child process of this
        process, other engines and servers started from it included: keep one in-process engine
        per process, or shut down only at the end."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.engine.shutdown()

    def __enter__(self) -> StreamEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def sched_counters_from(states: Any) -> dict | None:
    """The plugin's `s2l_sched` entry in SGLang's internal states (one per scheduler), if any."""
    for state in states or []:
        if isinstance(state, dict) and isinstance(state.get("s2l_sched"), dict):
            return dict(state["s2l_sched"])
    return None
