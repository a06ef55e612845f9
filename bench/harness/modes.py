"""Benchmark modes: how one query's chunks reach the engine. A registry, one class per mode.

- `wait`:     non-streaming: wait for the final chunk, then one plain SGLang request.
- `warming`:  plain SGLang prefix warming: after each non-final chunk, resend the prompt so far
              with `max_new_tokens=0` without waiting for it (the radix cache keeps what it
              computed; LRU may evict it under pressure); then the full request.
- `sessions`: SGLang's own streaming sessions (append mode only): one prefill-only session turn
              per chunk, each chunk tokenized alone, the client waiting for each turn before
              sending the next (a streaming session takes one request at a time); the final
              turn carries the last chunk and the question. SGLang sessions cannot replace
              their context, so update-mode traces do not apply.
- `stream`:   our streams (open, append/update per chunk, finish with the question), under the
              engine's stream policy: `stream-default`, `stream-fcfs`, ...
- `stream-nopub`: the same with publication at close switched off for its replays
              (`StreamEngine.set_publish_at_close(False)`: a closed stream's KV is freed, as
              SGLang frees a streaming session's), `stream-nopub-fcfs`, ...: an A/B of
              publication on one engine, interleaved with the other modes. Needs an engine that
              switches at run time (in process).

Sessions and streams are opened when the query arrives (before its retrieval returns anything),
as a client that knows a query is coming would: opening is a round trip to the scheduler, which
answers between batches.

TTFT is always measured by the client, from the final chunk's scheduled arrival to the first
output that carries a token. Every mode cleans up after a failure or a cancellation (timeout):
requests aborted, sessions closed, streams aborted.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
from collections.abc import AsyncIterator, Callable
from typing import ClassVar

from bench.harness.backends import Backend
from bench.harness.queries import Query
from bench.harness.record import QueryRecord, Timeline, has_token
from s2l_sglang.registry import Registry

PREFILL_ONLY = {"max_new_tokens": 0}
_nonce = itertools.count()
#: this process's mark in every id: two runs against one server (its streams may outlive a
#: run that timed out, until their idle timeout) must not reuse each other's ids
_RUN = secrets.token_hex(3)
_UNSAFE = re.compile(r"[^A-Za-z0-9._~-]")


class Mode:
    """How a query is sent. Subclass, implement `run`, decorate with `register(name)`."""

    name: ClassVar[str] = ""
    trace_modes: ClassVar[tuple[str, ...]] = ("append", "update")
    uses_policy: ClassVar[bool] = False  # True: results depend on the engine's stream policy
    #: the engine's `publish_at_close` for this mode's replays; None: as the engine started
    publish_at_close: ClassVar[bool | None] = None

    def __init__(self, policy: str | None = None):
        self.policy = policy

    @property
    def label(self) -> str:
        return f"{self.name}-{self.policy}" if self.uses_policy and self.policy else self.name

    def applies_to(self, trace_mode: str) -> bool:
        return trace_mode in self.trace_modes

    async def run(
        self, backend: Backend, query: Query, rec: QueryRecord, tl: Timeline, params: dict
    ) -> None:
        """Replay `query` starting at `rec.start` on `tl`, filling `rec`."""
        raise NotImplementedError

    @staticmethod
    def new_id(query: Query, label: str) -> str:
        """A fresh request or stream id naming the query: a valid stream id (1-128 of
        `A-Z a-z 0-9 . _ ~ -`, `stream.manager.STREAM_ID`) whatever the query's id holds; the
        leading run mark and counter keep it unique once cut, also across runs."""
        return _UNSAFE.sub("-", f"b{_RUN}.{next(_nonce)}-{label}-{query.id}")[:128]


_MODES: Registry[type[Mode]] = Registry("mode")


def register(name: str) -> Callable[[type[Mode]], type[Mode]]:
    return _MODES.register(name)


def mode_names() -> list[str]:
    return _MODES.names()


def get_mode(name: str, policy: str | None = None) -> Mode:
    """A mode by name (`stream` takes the engine's policy for its label)."""
    return _MODES.get(name)(policy)


def per_policy(name: str) -> bool:
    """Whether mode `name` runs once per stream policy (`stream`, `stream-nopub`)."""
    return _MODES.get(name).uses_policy


async def consume(outputs: AsyncIterator[dict], rec: QueryRecord, tl: Timeline) -> dict:
    """Drain one request's outputs; the first with a token sets `rec.first_token_at`."""
    last: dict = {}
    async for out in outputs:
        if rec.first_token_at is None and has_token(out):
            rec.first_token_at = tl.now()
        last = out
    return last


async def prefill(backend: Backend, ids: list[int], rid: str, rec: QueryRecord, session=None):
    """A prefill-only request (max_new_tokens=0); aborted if cancelled."""
    done = False
    try:
        last: dict = {}
        async for out in backend.generate(ids, PREFILL_ONLY, rid, session):
            last = out
        done = True
        rec.account(last)
        _check_finish(last)
    finally:
        if not done:
            await _quietly(backend.abort_request(rid))


async def generate(
    backend: Backend,
    ids: list[int],
    params: dict,
    rid: str,
    rec: QueryRecord,
    tl: Timeline,
    session: str | None = None,
) -> None:
    """The request that generates: sets first_token_at, done_at and the token counts."""
    done = False
    try:
        out = await consume(backend.generate(ids, params, rid, session), rec, tl)
        done = True
    finally:
        if not done:
            await _quietly(backend.abort_request(rid))
    rec.done_at = tl.now()
    rec.account(out)
    meta = out.get("meta_info") or {}
    rec.prompt_tokens = int(meta.get("prompt_tokens", len(ids)))
    rec.unprefilled_at_finish = rec.prompt_tokens - int(meta.get("cached_tokens", 0))
    rec.output_tokens = int(meta.get("completion_tokens", 0))
    _check_finish(out)


def _check_finish(out: dict) -> None:
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise RuntimeError(f"request aborted: {reason.get('message', '')}")


async def _quietly(coro) -> None:
    try:
        await asyncio.shield(asyncio.ensure_future(coro))
    except Exception:  # cleanup must not hide the original failure
        pass


@register("wait")
class Wait(Mode):
    async def run(self, backend, query, rec, tl, params):
        await tl.until(rec.final_at)
        rec.chunks = len(query.chunks)
        rid = self.new_id(query, self.label)
        await generate(backend, backend.encode(query.final_prompt), params, rid, rec, tl)


@register("warming")
class Warming(Mode):
    async def run(self, backend, query, rec, tl, params):
        base = self.new_id(query, self.label)
        warmers: list[asyncio.Task] = []
        try:
            for i, chunk in enumerate(query.chunks[:-1]):
                await tl.until(rec.start + chunk.t)
                rec.chunks += 1
                ids = backend.encode(query.prompt(i))
                warmers.append(asyncio.ensure_future(prefill(backend, ids, f"{base}-w{i}", rec)))
            await tl.until(rec.final_at)
            rec.chunks += 1
            ids = backend.encode(query.final_prompt)
            await generate(backend, ids, params, base, rec, tl)
            await asyncio.gather(*warmers)
        finally:
            for task in warmers:
                task.cancel()
            await asyncio.gather(*warmers, return_exceptions=True)


@register("sessions")
class Sessions(Mode):
    trace_modes = ("append",)

    async def run(self, backend, query, rec, tl, params):
        sid = self.new_id(query, self.label)
        chunks = query.chunks
        await tl.until(rec.start)  # the client opens its session when the query arrives
        await backend.open_session(sid)
        try:
            for i, chunk in enumerate(chunks[:-1]):
                await tl.until(rec.start + chunk.t)  # at once if the previous turn ran late
                rec.chunks += 1
                text = (query.head if i == 0 else "") + chunk.text
                await prefill(backend, backend.encode(text), f"{sid}-t{i}", rec, session=sid)
            await tl.until(rec.final_at)
            rec.chunks += 1
            text = (query.head if len(chunks) == 1 else "") + chunks[-1].text + query.tail
            ids = backend.encode(text)
            await generate(backend, ids, params, f"{sid}-final", rec, tl, session=sid)
        finally:
            await _quietly(backend.close_session(sid))


@register("stream")
class Stream(Mode):
    uses_policy = True

    async def run(self, backend, query, rec, tl, params):
        sid = self.new_id(query, self.label)
        chunks, update = query.chunks, query.mode == "update"
        finished = False
        await tl.until(rec.start)  # the client opens its stream when the query arrives
        try:
            await backend.stream_open(sid, params, "")
            for i, chunk in enumerate(chunks[:-1]):
                await tl.until(rec.start + chunk.t)
                rec.chunks += 1
                if update:
                    await backend.stream_update(sid, query.prompt(i))
                else:
                    await backend.stream_append(sid, query.prompt(0) if i == 0 else chunk.text)
            await tl.until(rec.final_at)
            rec.chunks += 1
            if len(chunks) == 1:
                last = query.final_prompt
            elif update:
                await backend.stream_update(sid, query.prompt(len(chunks) - 1))
                last = query.tail
            else:
                last = chunks[-1].text + query.tail
            out = await consume(backend.stream_finish(sid, last), rec, tl)
            finished = True
        finally:
            if not finished:
                await _quietly(backend.stream_abort(sid))
        rec.done_at = tl.now()
        _check_finish(out)
        meta = out.get("meta_info") or {}
        stream = meta.get("stream") or {}
        rec.prompt_tokens = int(meta.get("prompt_tokens", 0))
        rec.output_tokens = int(meta.get("completion_tokens", 0))
        rec.requests = int(stream.get("turns", 0))
        rec.prefilled = int(stream.get("prefilled", 0))
        rec.reused = int(stream.get("reused", 0))
        rec.invalidated = int(stream.get("invalidated", 0))
        rec.unprefilled_at_finish = stream.get("unprefilled_at_finish")
        rec.extra["engine_ttft_s"] = stream.get("ttft_s")
        rec.extra["waited_for_turn_s"] = stream.get("waited_for_turn_s")
        # tokens of a speculative turn still queued at the finish, carried by the final turn
        rec.extra["promoted"] = stream.get("promoted")


@register("stream-nopub")
class StreamNoPublish(Stream):
    publish_at_close = False
