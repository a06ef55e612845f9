"""Stream operations for SGLang frontend backends, and the in-process `StreamEngineBackend`.

`stream_context` (frontend/lang.py) drives a stream through a `StreamOps` object, which it gets
from the program's backend with `stream_ops_for(backend)`:

    backend with a `stream_ops()` method  -> that (StreamEngineBackend: the in-process engine)
    sglang.RuntimeEndpoint                -> HTTPStreamOps: the /stream routes of its server

All `StreamOps` calls are synchronous: they run in the program's executor thread (SGLang's
`StreamExecutor` worker). Errors are `frontend.errors.StreamAPIError`s for both backends. A
finish with `keep_open=True` leaves the stream open for the next chunks and finish (an agent
loop; lang.py).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

from sglang.lang.backend.base_backend import BaseBackend
from sglang.lang.chat_template import get_chat_template, get_chat_template_by_model_path
from sglang.lang.global_config import global_config
from sglang.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR, SglSamplingParams

from frontend.client import StreamClient
from frontend.errors import error_from_stream_error


class StreamOps(Protocol):
    """One backend's stream commands, called from the executor thread."""

    def open(self, sid: str, text: str) -> None: ...
    def append(self, sid: str, text: str) -> None: ...
    def update(self, sid: str, text: str) -> None: ...
    def finish(
        self, sid: str, text: str, sampling_params: dict, keep_open: bool = False
    ) -> dict: ...
    def finish_iter(
        self, sid: str, text: str, sampling_params: dict, keep_open: bool = False
    ) -> Iterator[dict]: ...
    def abort(self, sid: str) -> None: ...
    def close(self) -> None: ...


def stream_ops_for(backend: Any) -> StreamOps:
    """The stream operations of a frontend backend (TypeError if it has none)."""
    if hasattr(backend, "stream_ops"):
        return backend.stream_ops()
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    if isinstance(backend, RuntimeEndpoint):
        return HTTPStreamOps(backend.base_url, backend.api_key)
    raise TypeError(
        f"stream_context needs sgl.RuntimeEndpoint or frontend.StreamEngineBackend, "
        f"not {type(backend).__name__}"
    )


def srt_sampling_params(params: SglSamplingParams) -> dict[str, Any]:
    """SGLang server sampling parameters for a gen, as `RuntimeEndpoint.generate` sends them."""
    out: dict[str, Any] = {
        "skip_special_tokens": global_config.skip_special_tokens_in_output,
        "spaces_between_special_tokens": global_config.spaces_between_special_tokens_in_out,
        **params.to_srt_kwargs(),
    }
    if params.dtype is not None:  # RuntimeEndpoint._handle_dtype_to_regex
        regex = {int: REGEX_INT, float: REGEX_FLOAT, str: REGEX_STR, bool: REGEX_BOOL}
        regex.update({t.__name__: r for t, r in list(regex.items())})
        if params.dtype not in regex:
            raise RuntimeError(f"Invalid dtype: {params.dtype}")
        out["regex"] = regex[params.dtype]
        if params.dtype in (int, float, "int", "float"):
            out["stop"] = list(out["stop"] or []) + [" ", "\n"]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items() if v is not None}


# ---- running async code from the executor thread ------------------------------------------


def iterate_on_loop(
    loop: asyncio.AbstractEventLoop, make: Callable[[], AsyncIterator[Any]]
) -> Iterator[Any]:
    """Run the async iterator `make()` on `loop` (running in another thread); yield its items.

    Leaving the iteration early cancels it on that loop.
    """
    items: queue.Queue = queue.Queue()
    done = object()

    async def pump() -> None:
        try:
            async for item in make():
                items.put((item, None))
        except BaseException as exc:
            items.put((done, exc))
            raise
        items.put((done, None))

    future = asyncio.run_coroutine_threadsafe(pump(), loop)
    try:
        while True:
            item, exc = items.get()
            if exc is not None:
                raise exc
            if item is done:
                return
            yield item
    finally:
        if not future.done():
            future.cancel()


def iterate_on_private_loop(loop: asyncio.AbstractEventLoop, aiterable: Any) -> Iterator[Any]:
    """Drive an async iterable on `loop`, a loop of this thread that is not running."""
    it = aiterable.__aiter__()
    try:
        while True:
            try:
                yield loop.run_until_complete(it.__anext__())
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(it, "aclose", None)
        if aclose is not None and not loop.is_closed():
            loop.run_until_complete(aclose())


# ---- HTTP: the /stream routes of a RuntimeEndpoint's server --------------------------------


class HTTPStreamOps:
    """`StreamOps` over HTTP: a `StreamClient` on a private event loop of the executor thread."""

    def __init__(self, base_url: str, api_key: str | None = None):
        self.loop = asyncio.new_event_loop()
        self.client = StreamClient(base_url, api_key=api_key)

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def open(self, sid: str, text: str) -> None:
        self._run(self.client.open(sid, None, text))

    def append(self, sid: str, text: str) -> None:
        self._run(self.client.append(sid, text))

    def update(self, sid: str, text: str) -> None:
        self._run(self.client.update(sid, text))

    def finish(self, sid: str, text: str, sampling_params: dict, keep_open: bool = False) -> dict:
        return self._run(self.client.finish(sid, text, sampling_params, keep_open=keep_open))

    def finish_iter(
        self, sid: str, text: str, sampling_params: dict, keep_open: bool = False
    ) -> Iterator[dict]:
        return iterate_on_private_loop(
            self.loop, self.client.finish_iter(sid, text, sampling_params, keep_open=keep_open)
        )

    def abort(self, sid: str) -> None:
        self._run(self.client.abort(sid))

    def close(self) -> None:
        if not self.loop.is_closed():
            self._run(self.client.close())
            self.loop.close()


# ---- in process: a StreamEngine ------------------------------------------------------------


class EngineStreamOps:
    """`StreamOps` over an in-process `s2l_sglang.stream.engine.StreamEngine`."""

    def __init__(self, engine: Any):
        self.engine = engine

    def _call(self, fn: Callable, *args: Any) -> Any:
        from s2l_sglang.stream.errors import StreamError

        try:
            return fn(*args)
        except StreamError as exc:
            raise error_from_stream_error(exc) from exc

    def open(self, sid: str, text: str) -> None:
        self._call(self.engine.open_stream, sid, None, text)

    def append(self, sid: str, text: str) -> None:
        self._call(self.engine.append, sid, text)

    def update(self, sid: str, text: str) -> None:
        self._call(self.engine.update, sid, text)

    def finish(self, sid: str, text: str, sampling_params: dict, keep_open: bool = False) -> dict:
        return self._call(self.engine.finish, sid, text, sampling_params, None, keep_open)

    def finish_iter(
        self, sid: str, text: str, sampling_params: dict, keep_open: bool = False
    ) -> Iterator[dict]:
        from s2l_sglang.stream.errors import StreamError

        async def outputs() -> AsyncIterator[dict]:
            finish = self.engine.streams.finish(sid, text, sampling_params, keep_open=keep_open)
            async for out in await finish:
                yield out

        try:
            yield from iterate_on_loop(self.engine.loop, outputs)
        except StreamError as exc:
            raise error_from_stream_error(exc) from exc

    def abort(self, sid: str) -> None:
        self._call(self.engine.abort, sid)

    def close(self) -> None:
        pass


class StreamEngineBackend(BaseBackend):
    """SGLang frontend backend over an in-process `StreamEngine`: plain gens and streams.

    eng = StreamEngine()
    sgl.set_default_backend(StreamEngineBackend(eng, chat_template_name="chatml"))
    """

    def __init__(self, engine: Any, chat_template_name: str | None = None):
        super().__init__()
        self.engine = engine
        self.model_path = engine.engine.server_args.model_path
        if chat_template_name:
            self.chat_template = get_chat_template(chat_template_name)
        else:
            self.chat_template = get_chat_template_by_model_path(self.model_path)

    def get_model_name(self) -> str:
        return self.model_path

    def stream_ops(self) -> StreamOps:
        return EngineStreamOps(self.engine)

    def _request(self, s: Any, sampling_params: SglSamplingParams, stream: bool) -> dict:
        if s.images_:
            raise NotImplementedError("StreamEngineBackend does not take images")
        request: dict[str, Any] = {
            "text": s.text_,
            "sampling_params": srt_sampling_params(sampling_params),
            "stream": stream,
        }
        for item in ("return_logprob", "logprob_start_len", "top_logprobs_num"):
            value = getattr(sampling_params, item, None)
            if value is not None:
                request[item] = value
        if sampling_params.return_text_in_logprobs is not None:
            request["return_text_in_logprobs"] = sampling_params.return_text_in_logprobs
        return request

    def _outputs(self, request: dict) -> Iterator[dict]:
        from sglang.srt.managers.io_struct import GenerateReqInput

        tm = self.engine.engine.tokenizer_manager

        async def outputs() -> AsyncIterator[dict]:
            async for out in tm.generate_request(GenerateReqInput(**request), None):
                yield out

        return iterate_on_loop(self.engine.loop, outputs)

    def generate(self, s: Any, sampling_params: SglSamplingParams):
        *_, out = self._outputs(self._request(s, sampling_params, stream=False))
        return out["text"], out["meta_info"]

    def generate_stream(self, s: Any, sampling_params: SglSamplingParams):
        pos = 0
        for out in self._outputs(self._request(s, sampling_params, stream=True)):
            piece = out["text"][pos:]
            pos += len(piece)
            yield piece, out["meta_info"]

    def flush_cache(self) -> None:
        """Empty SGLang's prefix cache (as `sgl.flush_cache`) once the engine is idle; a
        RuntimeError if SGLang still refuses (`flush_when_idle`), as SGLang's own backend fails
        on a refused `/flush_cache`."""
        from s2l_sglang.stream.engine import flush_when_idle

        self.engine._call(flush_when_idle(self.engine.engine.tokenizer_manager))
