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

from s2l_sglang.stream.manager import StreamManager, sched_counters_from

__all__ = ["FLUSH_TIMEOUT_S", "StreamEngine", "flush_when_idle", "sched_counters_from"]

#: seconds `flush_when_idle` waits for the engine to go idle
FLUSH_TIMEOUT_S = 60.0


async def flush_when_idle(tokenizer_manager: Any, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
    """Empty SGLang's prefix cache once the engine is idle (SGLang's deferred flush): SGLang
    refuses a flush while a request runs, also a moment after the last one returned, and a
    refused flush leaves the cache full. A RuntimeError if SGLang still refuses after
    `timeout_s` seconds. Run it on the engine's event loop."""
    result = await tokenizer_manager.flush_cache(timeout_s=timeout_s)
    if not result.success:
        raise RuntimeError(f"SGLang refused to flush the prefix cache: {result.message}")


class StreamEngine:
    """An SGLang engine (embedded model and CPU defaults unless overridden) plus streams."""

    def __init__(
        self,
        idle_timeout: float | None = 60.0,
        stream_policy: str = "default",
        preemption: str = "auto",
        host_kv_tokens: int | None = None,
        speculative_chunk: int | None = None,
        speculative_reserve: int | None = None,
        hold_back: bool = True,
        hold_back_settle: float = 1.0,
        pipelined_finish: bool = True,
        publish_at_close: bool = True,
        **engine_kwargs: Any,
    ):
        """`stream_policy`: the scheduler's stream policy (`default`, `fcfs`, `lcas`, `mcps`;
        switchable later with `set_stream_policy`). `preemption`: how streams give up KV under
        pressure (`auto`: by the saved cost profile of this setup, recompute if none;
        `recompute`; `swap`). `host_kv_tokens`: the host pool for swapped KV, in tokens
        (default: as many as 4 GiB of the model's KV holds). `idle_timeout`: seconds before a
        quiet stream is aborted (None: never). `speculative_chunk`: most new tokens per
        prefill turn of a context not yet final, and per prefill step (a final context waits
        behind at most that much; None: chosen from the prefill step that this setup's saved
        profile measured (`s2l profile`), else 256 on a CPU host, 512 on a GPU).
        `speculative_reserve`: KV tokens that such prefill leaves free for final contexts and
        plain requests (None: the largest seen, at most half the pool). `hold_back`: in update
        mode, the tail a refinement rewrote is prefilled only at the lowest priority, and
        `hold_back_settle`: once the stream has been quiet for a while (at most that many
        seconds; see `StreamConfig`). `pipelined_finish`: a finish sends the final turn at
        once, and the scheduler holds it until the turn in flight ends (False: the manager
        waits for that turn first). `publish_at_close`: a closed stream's KV stays in the
        prefix cache, as a finished plain request's (False: freed, as SGLang's streaming
        sessions do). A bad value is a ValueError here, before anything
        starts. Other arguments go to
        `sgl.Engine` (the embedded model and CPU defaults unless overridden)."""
        import sglang as sgl

        from s2l_sglang.config import StreamConfig, attach, with_measured_chunk
        from s2l_sglang.defaults import engine_kwargs as default_kwargs

        self.config = StreamConfig(
            stream_policy=stream_policy,
            preemption=preemption,
            host_kv_tokens=host_kv_tokens,
            stream_idle_timeout=idle_timeout,
            **(
                {}
                if speculative_chunk is None
                else {"speculative_chunk": speculative_chunk, "speculative_chunk_source": "given"}
            ),
            speculative_reserve=speculative_reserve,
            hold_back=hold_back,
            hold_back_settle=hold_back_settle,
            pipelined_finish=pipelined_finish,
            publish_at_close=publish_at_close,
        )
        kwargs = default_kwargs(**engine_kwargs)
        kwargs.setdefault("log_level", "error")  # as sgl.Engine does for keyword arguments
        server_args = sgl.Engine.server_args_class(**kwargs)
        self.config = with_measured_chunk(self.config, server_args)
        attach(server_args, self.config)  # reaches the scheduler with SGLang's own arguments
        self.engine = sgl.Engine(server_args=server_args)
        tm = self.engine.tokenizer_manager
        self.tokenizer = tm.tokenizer
        self.loop = self.engine.loop
        self.streams = StreamManager(
            tm, self.config, page_size=self.engine.server_args.page_size or 1
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
        cache_salt: str | None = None,
    ) -> dict:
        """A plain (non-streaming) SGLang request. `cache_salt` (SGLang's own field) puts it in
        its own prefix-cache namespace: it reuses no KV of requests or streams without it."""
        return self._call(
            self._generate(
                text=prompt,
                input_ids=input_ids,
                sampling_params=sampling_params or {},
                cache_salt=cache_salt,
            )
        )

    async def async_generate(
        self,
        prompt: str | None = None,
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        cache_salt: str | None = None,
    ) -> dict:
        return await self._acall(
            self._generate(
                text=prompt,
                input_ids=input_ids,
                sampling_params=sampling_params or {},
                cache_salt=cache_salt,
            )
        )

    # ---- streams: sync ----------------------------------------------------------------------

    # Each chunk is text or, with `input_ids=`, token ids; one stream does not mix the two.

    def open_stream(
        self,
        sid: str,
        sampling_params: dict | None = None,
        text: str = "",
        input_ids: list[int] | None = None,
    ) -> dict:
        return self._call(self.streams.open(sid, sampling_params, text, input_ids))

    def append(self, sid: str, text: str = "", input_ids: list[int] | None = None) -> dict:
        return self._call(self.streams.append(sid, text, input_ids))

    def update(self, sid: str, text: str = "", input_ids: list[int] | None = None) -> dict:
        return self._call(self.streams.update(sid, text, input_ids))

    def finish(
        self,
        sid: str,
        text: str = "",
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        keep_open: bool = False,
    ) -> dict:
        """Finish the stream and return its final output (`meta_info["stream"]` has TTFT).
        `keep_open`: the stream stays open with its output in its context (an agent loop:
        append a tool's result, finish again)."""
        return self._call(
            self._collect(self.streams.finish(sid, text, sampling_params, input_ids, keep_open))
        )

    def abort(self, sid: str) -> None:
        self._call(self.streams.abort(sid))

    def status(self, sid: str) -> dict:
        return self._call(self._status(sid))

    async def _status(self, sid: str) -> dict:
        return self.streams.status(sid)

    # ---- streams: async ---------------------------------------------------------------------

    async def async_open_stream(
        self,
        sid: str,
        sampling_params: dict | None = None,
        text: str = "",
        input_ids: list[int] | None = None,
    ) -> dict:
        return await self._acall(self.streams.open(sid, sampling_params, text, input_ids))

    async def async_append(
        self, sid: str, text: str = "", input_ids: list[int] | None = None
    ) -> dict:
        return await self._acall(self.streams.append(sid, text, input_ids))

    async def async_update(
        self, sid: str, text: str = "", input_ids: list[int] | None = None
    ) -> dict:
        return await self._acall(self.streams.update(sid, text, input_ids))

    async def async_finish(
        self,
        sid: str,
        text: str = "",
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        keep_open: bool = False,
    ) -> dict:
        return await self._acall(
            self._collect(self.streams.finish(sid, text, sampling_params, input_ids, keep_open))
        )

    async def async_abort(self, sid: str) -> None:
        await self._acall(self.streams.abort(sid))

    # ---- engine state -----------------------------------------------------------------------

    def flush_cache(self) -> bool:
        """Empty SGLang's prefix cache (refused by SGLang while requests run; `flush_when_idle`
        waits for them)."""
        return bool(self._call(self.engine.tokenizer_manager.flush_cache()).success)

    def set_stream_policy(self, name: str) -> None:
        """Switch the scheduler's stream policy at run time (from its next scheduling step);
        returns once the scheduler reports it. A ValueError for an unknown name."""
        self._call(self.streams.set_policy(name))

    def set_publish_at_close(self, on: bool) -> None:
        """Switch `publish_at_close` at run time (from the scheduler's next stream close on):
        with it off a closing stream's KV is freed as SGLang frees it. Returns once the
        scheduler reports it (an A/B of publication on one engine, as the benchmark's
        `stream-nopub` mode runs it)."""
        self._call(self.streams.set_publish_at_close(on))

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
