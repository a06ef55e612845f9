"""`stream_context`: a primitive of SGLang's frontend language for streamed context.

    @sgl.function
    def rag(s, question, retriever):
        s += "Passages:\\n"
        s += stream_context(retriever.batches(question))       # chunks prefill as they land
        s += "\\nQuestion: " + question + "\\nAnswer:"
        s += sgl.gen("answer", max_tokens=64)                  # finishes the stream

Semantics (the stream's context is always "the program's text so far"):
- at `stream_context`, a stream opens with the program's text before it; each item of `source`
  (a sync or async iterable) is pushed as it arrives. Append mode: an item is a chunk added to
  the context. Update mode: an item is the whole refined part after the program's text before
  the call, a string or a list of documents joined with a blank line ("\\n\\n").
- the program's text becomes: text before + the chunks (append) or + the last item (update).
- text added afterwards (the question) is the finish's last chunk; the next `sgl.gen` finishes
  the stream with the gen's sampling parameters instead of sending a new request, and its output
  is added to the program state like any gen's (variable, meta_info with `meta_info["stream"]`).
- a second `stream_context` before the gen continues the same stream.
- an error (in `source`, a backend, or any later expression) or a program that ends without a
  gen aborts the stream, so its KV is freed at once.

The items are consumed in the program's executor thread (SGLang's `StreamExecutor` worker): a
sync iterable is iterated there; an async iterable runs on a private event loop of that thread,
so it must not use objects bound to another event loop. Backends: `sgl.RuntimeEndpoint` (the
server's /stream routes) and `frontend.StreamEngineBackend` (in process); see backend.py.
How the executor learns the new node: hooks.py. The public `stream_context(...)`: api.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sglang.lang.ir import SglExpr, SglGen

from frontend.backend import StreamOps, iterate_on_private_loop, srt_sampling_params, stream_ops_for

MODES = ("append", "update")
_STATE = "_s2l_stream"  # attribute of a StreamExecutor with an open stream


class SglStreamContext(SglExpr):
    """IR node: the context goes on with the items of `source`, streamed to the engine."""

    def __init__(
        self, source: Iterable | AsyncIterable, mode: str = "append", stream_id: str | None = None
    ):
        super().__init__()
        self.source = source
        self.mode = mode
        self.stream_id = stream_id

    def __repr__(self) -> str:
        return f"StreamContext(mode={self.mode!r})"


class SglStreamClose(SglExpr):
    """IR node (internal): abort the executor's open stream, if any (the program's end)."""

    def __repr__(self) -> str:
        return "StreamClose()"


@dataclass
class OpenStream:
    """An executor's open stream. Invariant: `sent` is the stream's context on the engine."""

    sid: str
    ops: StreamOps
    sent: str

    def push(self, target: str, mode: str) -> None:
        """Bring the engine's context to `target` (append the new tail, or update it all)."""
        if mode == "append" and target.startswith(self.sent):
            if len(target) > len(self.sent):
                self.ops.append(self.sid, target[len(self.sent) :])
        elif target != self.sent and target:
            self.ops.update(self.sid, target)
        self.sent = target


# ---- executor branches (called from the hooks on StreamExecutor, in its worker thread) ---------


def has_stream(executor: Any) -> bool:
    return getattr(executor, _STATE, None) is not None


def execute_stream_context(executor: Any, expr: SglStreamContext) -> None:
    """Open the executor's stream (or go on with it) and push `expr.source`'s items."""
    stream = getattr(executor, _STATE, None)
    if stream is not None and expr.stream_id not in (None, stream.sid):
        close_stream(executor)
        raise ValueError(f"stream {stream.sid!r} is open: a gen must finish it first")
    if stream is None:
        ops = stream_ops_for(executor.backend)
        stream = OpenStream(expr.stream_id or uuid.uuid4().hex, ops, executor.text_)
        try:
            ops.open(stream.sid, executor.text_)
        except BaseException:
            ops.close()
            raise
        setattr(executor, _STATE, stream)
    try:
        prefix, latest = executor.text_, None
        for item in _items(expr.source):
            if expr.mode == "append":
                executor.text_ += _chunk(item)
                stream.push(executor.text_, "append")
            else:
                latest = _refined(item)
                stream.push(prefix + latest, "update")
        if latest is not None:  # update mode: the program's text grows once, by the last item
            executor.text_ = prefix + latest
    except BaseException:
        close_stream(executor)
        raise


def execute_gen(executor: Any, expr: SglGen) -> None:
    """The gen after a stream_context: finish the stream; the output goes to the state."""
    stream: OpenStream = getattr(executor, _STATE)
    setattr(executor, _STATE, None)
    finished = False
    try:
        if executor.num_api_spec_tokens is not None:
            raise ValueError("stream_context does not work with API speculative execution")
        params = executor._resolve_sampling_params(expr.sampling_params)
        if params.return_logprob:
            raise ValueError("stream_context: a gen that finishes a stream returns no logprobs")
        srt_params = srt_sampling_params(params)
        text = executor.text_
        if not text.startswith(stream.sent):  # the text before was rewritten since
            stream.push(text, "update")
        last_chunk = text[len(stream.sent) :]
        if executor.stream:
            _stream_output(
                executor, expr.name, stream.ops.finish_iter(stream.sid, last_chunk, srt_params)
            )
        else:
            out = stream.ops.finish(stream.sid, last_chunk, srt_params)
            executor.text_ += out["text"]
            executor.variables[expr.name] = out["text"]
            executor.meta_info[expr.name] = out["meta_info"]
            executor.variable_event[expr.name].set()
        finished = True
    finally:
        if not finished:
            _abort_quietly(stream)
        stream.ops.close()


def close_stream(executor: Any) -> None:
    """Abort the executor's open stream, if any (errors ignored: it may have ended already)."""
    stream = getattr(executor, _STATE, None)
    if stream is None:
        return
    setattr(executor, _STATE, None)
    try:
        _abort_quietly(stream)
    finally:
        stream.ops.close()


# ---- helpers --------------------------------------------------------------------------------


def _stream_output(executor: Any, name: str | None, outputs: Iterator[dict]) -> None:
    """Like `StreamExecutor._execute_gen` with `stream=True`: text and events per output."""
    executor.variables[name] = ""
    executor.stream_var_event[name].set()
    pos = 0
    for out in outputs:
        piece = out["text"][pos:]
        pos += len(piece)
        executor.text_ += piece
        executor.variables[name] += piece
        executor.meta_info[name] = out["meta_info"]
        executor.stream_var_event[name].set()
        executor.stream_text_event.set()
    executor.variable_event[name].set()
    executor.stream_var_event[name].set()


def _abort_quietly(stream: OpenStream) -> None:
    try:
        stream.ops.abort(stream.sid)
    except Exception:
        pass


def _items(source: Iterable | AsyncIterable) -> Iterator[Any]:
    if isinstance(source, AsyncIterable):
        loop = asyncio.new_event_loop()
        try:
            yield from iterate_on_private_loop(loop, source)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    else:
        yield from source


def _chunk(item: Any) -> str:
    if not isinstance(item, str):
        raise TypeError(f"an append-mode item must be a str, not {type(item).__name__}")
    return item


def _refined(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, (list, tuple)) and all(isinstance(d, str) for d in item):
        return "\n\n".join(item)
    raise TypeError(f"an update-mode item must be a str or a list of str, not {item!r:.60}")
