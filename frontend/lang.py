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

Agent loops, `stream_context(source, keep_open=True)`: every gen that finishes the stream keeps
it open (the server's `finish(keep_open=True)`):

    @sgl.function
    def agent(s, question):
        s += "Question: " + question + "\\nWhich expression should I compute?\\n"
        s += stream_context([], keep_open=True)       # opens the stream with the text so far
        s += sgl.gen("call", max_tokens=16, stop="\\n")
        s += "\\nResult: " + calculator(s["call"]) + "\\nAnswer:"   # appended to the stream
        s += sgl.gen("answer", max_tokens=16)       # generates again, nothing recomputed

- after such a gen the stream holds the prompt and the generated tokens as a fixed history
  (their KV stays on the server); the text the program adds after the gen (a tool's result, the
  next question) is the next finish's chunk, and the next `sgl.gen` generates again. A
  `stream_context` after the gen streams its items after the history, as a retriever's would
  (update mode replaces what came after the history only).
- token level: the server tokenizes the text after a generating turn on its own and puts it
  after the generated token ids (no BOS). So the next prompt equals a plain request over
  prompt ids + output ids + the new text's ids, not necessarily a plain request over the
  program's re-tokenized text; and a gen that stopped at a stop or EOS token has that token in
  the history though the program's text may not show it.
- the text before a kept-open gen is history and cannot change: a program that rewrites it
  (text before that gen that no longer starts the program's text) fails, and its stream is
  aborted. Two gens with nothing between them are refused by the server (`EmptyChunk`).
- `keep_open` on a later `stream_context` of the same stream changes it for the next gens:
  `keep_open=False` makes the next gen close the stream; the default (None) keeps the stream's
  setting (False for a new stream). A stream still open when the program ends is aborted
  (its KV freed), as one that no gen finished.

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
        self,
        source: Iterable | AsyncIterable,
        mode: str = "append",
        stream_id: str | None = None,
        keep_open: bool | None = None,
    ):
        super().__init__()
        self.source = source
        self.mode = mode
        self.stream_id = stream_id
        self.keep_open = keep_open

    def __repr__(self) -> str:
        return f"StreamContext(mode={self.mode!r}, keep_open={self.keep_open!r})"


class SglStreamClose(SglExpr):
    """IR node (internal): abort the executor's open stream, if any (the program's end)."""

    def __repr__(self) -> str:
        return "StreamClose()"


@dataclass
class OpenStream:
    """An executor's open stream. Invariant: `sent` is the stream's context on the engine, and
    its first `history` characters are the program's text up to the last kept-open gen (the
    engine holds them as fixed tokens: prompt and output ids)."""

    sid: str
    ops: StreamOps
    sent: str
    keep_open: bool = False
    history: int = 0
    generations: int = 0

    def push(self, target: str, mode: str) -> None:
        """Bring the engine's context to `target` (append the new tail, or update what follows
        the history)."""
        if not target.startswith(self.sent[: self.history]):
            raise ValueError(
                f"stream {self.sid!r}: the program's text before its last gen changed, but the "
                "stream holds it as history (keep_open)"
            )
        if mode == "append" and target.startswith(self.sent):
            if len(target) > len(self.sent):
                self.ops.append(self.sid, target[len(self.sent) :])
        elif target != self.sent:
            if len(target) == self.history:
                raise ValueError(
                    f"stream {self.sid!r}: an update cannot empty the context"
                    + (" after the history" if self.history else "")
                )
            self.ops.update(self.sid, target[self.history :])
        self.sent = target

    def generated(self, text: str) -> None:
        """A gen kept the stream open: the program's `text` so far is now its history."""
        self.sent, self.history = text, len(text)
        self.generations += 1


# ---- executor branches (called from the hooks on StreamExecutor, in its worker thread) ---------


def has_stream(executor: Any) -> bool:
    return getattr(executor, _STATE, None) is not None


def execute_stream_context(executor: Any, expr: SglStreamContext) -> None:
    """Open the executor's stream (or go on with it) and push `expr.source`'s items."""
    stream = getattr(executor, _STATE, None)
    if stream is not None and expr.stream_id not in (None, stream.sid):
        close_stream(executor)
        raise ValueError(
            f"stream {stream.sid!r} is open: a gen must finish it first "
            "(one stream at a time per program)"
        )
    if stream is None:
        ops = stream_ops_for(executor.backend)
        sid = expr.stream_id or uuid.uuid4().hex
        stream = OpenStream(sid, ops, executor.text_, keep_open=bool(expr.keep_open))
        try:
            ops.open(stream.sid, executor.text_)
        except BaseException:
            ops.close()
            raise
        setattr(executor, _STATE, stream)
    elif expr.keep_open is not None:
        stream.keep_open = expr.keep_open
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
    """The gen after a stream_context: finish the stream; the output goes to the state. With
    `keep_open` the stream stays the executor's, its text so far the stream's history."""
    stream: OpenStream = getattr(executor, _STATE)
    keep_open, done = stream.keep_open, False
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
            outputs = stream.ops.finish_iter(stream.sid, last_chunk, srt_params, keep_open)
            _stream_output(executor, expr.name, outputs)
        else:
            out = stream.ops.finish(stream.sid, last_chunk, srt_params, keep_open)
            executor.text_ += out["text"]
            executor.variables[expr.name] = out["text"]
            executor.meta_info[expr.name] = out["meta_info"]
            executor.variable_event[expr.name].set()
        done = True
    finally:
        if done and keep_open:
            stream.generated(executor.text_)
        else:
            setattr(executor, _STATE, None)
            try:
                if not done:
                    _abort_quietly(stream)
            finally:
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
