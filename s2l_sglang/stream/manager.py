"""The stream manager: stream lifecycle on top of SGLang's tokenizer manager (async, one loop).

Lives in the process that owns SGLang's `TokenizerManager` (the in-process engine or the HTTP
server). A stream is a streaming session of SGLang's scheduler; each engine turn is a request of
that session, sent over SGLang's own tokenizer-manager -> scheduler ZMQ path:

    open    -> open_session(streaming=True)   (+ a prefill turn for the first chunk, if any)
    append  -> text grows; a prefill-only turn (max_new_tokens=0) sends the new tokens
    update  -> text replaced; the turn rolls the session back to the longest common prefix
               (radix_ext, through the plugin's Session.create_req hook) and sends the rest
    finish  -> the final turn, with the user's sampling parameters: output streams back
    abort   -> abort the turn in flight, close the session (its KV is freed)

One turn per stream is in flight at a time; chunks that arrive meanwhile only update the text,
and the next turn sends all of them at once (queued and merged). The session keeps the KV
between turns (it is not evictable by LRU while the stream lives).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from s2l_sglang.config import StreamConfig
from s2l_sglang.rid import (
    CANCELLED,
    REBASE,
    final_rid,
    is_final,
    is_volatile,
    turn_rid,
    volatile_rid,
)
from s2l_sglang.stream import isolation
from s2l_sglang.stream.chat import ChatContext, chat_context
from s2l_sglang.stream.errors import (
    ChatStreamCall,
    ContextTooLong,
    DuplicateStream,
    EmptyChunk,
    EngineError,
    Forbidden,
    InvalidMessages,
    InvalidStreamId,
    InvalidTokenIds,
    MixedInput,
    NotAChatStream,
    ReaderStalled,
    StreamClosed,
    StreamError,
    UnknownStream,
    engine_error,
)
from s2l_sglang.stream.params import check_sampling_params
from s2l_sglang.stream.tokens import (
    Anchor,
    Turn,
    incremental_tokenization_works,
    lcp,
    next_turn,
    tokenize_from,
)

PREFILL_ONLY = {"max_new_tokens": 0}
#: stream ids every route can address: URL-safe characters only (`GET /stream/{id}` takes one
#: path segment), no "::" (turn rids are `<sid>::s2l<n>`, rid.py)
STREAM_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")
#: outputs of a finish buffered for its reader; a reader that takes none for the idle timeout
#: (60 s without one) is dropped and the stream aborted
OUTPUT_QUEUE = 64
STALLED_READER_S = 60.0
#: text longer than this (characters to tokenize) is tokenized off the event loop
OFF_LOOP_CHARS = 1 << 16
#: a prefill turn in flight is cancelled when a newer context drops more of it than this
CANCEL_MIN_TOKENS = 16
#: update mode: a volatile tail is sent once the stream has been quiet for this many times the
#: longest gap between its versions (`StreamManager._settle`)
SETTLE_GAPS = 2.0
logger = logging.getLogger(__name__)


class Rebased(Exception):
    """A pipelined final turn the scheduler sent back: the turn it was built on did not
    finish (abort `REBASE`); the manager sends it again, built on what the session holds."""


@dataclass
class StreamCounters:
    chunks: int = 0
    turns: int = 0
    prefilled: int = 0  # prompt tokens computed by the engine
    reused: int = 0  # prompt tokens served from KV already held or cached
    invalidated: int = 0  # held tokens dropped by rollbacks (update, token re-alignment)
    speculative: int = 0  # of `prefilled`: by prefill turns of a context not yet final
    cancelled: int = 0  # new tokens of prefill turns cancelled: a newer context dropped them
    #: new tokens of a prefill turn still queued at the finish, cancelled so that the final
    #: turn (committed work) carries them instead of waiting behind it
    promoted: int = 0
    #: of `speculative`: prefilled by turns of a volatile tail, at the lowest priority
    held_back: int = 0

    def add(self, other: StreamCounters) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class State(enum.Enum):
    """A stream's lifecycle: OPEN (chunks go in) -> FINISHING (the context is final; the final
    turn runs) -> CLOSED (session closed, KV freed), or back to OPEN after a finish that keeps
    the stream open. Every end goes through `StreamManager._close`."""

    OPEN = "open"
    FINISHING = "finishing"
    CLOSED = "closed"


@dataclass
class Stream:
    """One stream as the manager sees it. `held` mirrors the tokens whose KV the session holds."""

    sid: str
    sampling_params: dict[str, Any]
    opened_at: float
    #: the SGLang session's id: not the stream id, not guessable (stream/isolation.py)
    key: str = ""
    #: what an HTTP call on the stream must carry (X-Stream-Token), returned by open
    token: str = ""
    #: data parallel (`--dp-size N`): the rank all turns of the stream go to, chosen at open
    dp_rank: int | None = None
    text: str = ""  # the context after `history`, for a stream of text chunks
    ids: list[int] = field(default_factory=list)  # history + the ids of the chunks since
    kind: str | None = None  # "text" or "ids": set by the first chunk, never mixed
    #: after a finish that kept the stream open: its whole prompt and output, fixed. Later
    #: chunks go after it, and an update replaces only what came after it.
    history: list[int] = field(default_factory=list)
    #: a text stream's context is re-tokenized from here on at each append (stream/tokens.py)
    anchor: Anchor = Anchor()
    generations: int = 0  # generating turns so far
    held: list[int] = field(default_factory=list)
    last_chunk_at: float = 0.0
    last_activity: float = 0.0
    pump: asyncio.Task | None = None
    inflight_rid: str | None = None
    inflight_target: list[int] | None = None  # the ids the engine holds once that turn ends
    inflight_keep: int = 0  # of which held before it
    cancelled_rid: str | None = None  # a prefill turn aborted because the context moved on
    cancel_for_final: bool = False  # ... or because the stream is finishing (`promoted`)
    #: pipelined finish: the prefill turn in flight at the finish, that the final turn is
    #: built on and sent behind without waiting for it (`StreamManager._at_finish`)
    pipeline_after: str | None = None
    pipelined_rid: str | None = None  # that final turn, while in flight
    #: update mode: ids from here on are the volatile tail (what the last update rewrote)
    volatile_from: int | None = None
    #: update mode: the longest time between two versions of the context so far
    update_gap: float = 0.0
    #: set when the context changes or the stream finishes or closes (wakes a settling pump)
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    state: State = State.OPEN
    #: set when the stream closes (a connection waiting on the stream learns it at once)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: held while a text chunk is tokenized (off the loop for long ones): chunks apply in
    #: call order
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    error: StreamError | None = None
    counters: StreamCounters = field(default_factory=StreamCounters)
    #: a chat stream's messages (`text` is the context message's content); None otherwise
    chat: ChatContext | None = None

    @property
    def finishing(self) -> bool:
        return self.state is State.FINISHING

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def complete(self) -> bool:
        return self.state is State.FINISHING


class StreamManager:
    """Stream lifecycle over one SGLang `TokenizerManager` (all methods run on its event loop)."""

    def __init__(
        self,
        tokenizer_manager: Any,
        config: StreamConfig | None = None,
        *,
        page_size: int = 1,
        max_chunk_chars: int = 1 << 20,
    ):
        self.tm = tokenizer_manager
        self.config = config or StreamConfig()
        self.tokenizer = tokenizer_manager.tokenizer
        self.context_len = int(tokenizer_manager.context_len)
        self.page_size = page_size
        self.idle_timeout = self.config.stream_idle_timeout
        self.max_chunk_chars = max_chunk_chars
        self.streams: dict[str, Stream] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # sid -> "finished" | "aborted: ..."
        self.totals = StreamCounters()
        self._reaper: asyncio.Task | None = None
        # Where final turns run instead of this tokenizer manager: set on a PD prefill
        # instance to `RouterFinal.outputs` (pd/final.py); called as (obj, prompt ids).
        self.final_outputs: Any = None
        # Chat streams: messages -> prompt ids through SGLang's own chat template (set by the
        # HTTP server, server/chat.py); synchronous, run off the event loop.
        self.chat_renderer: Callable[[list[dict]], list[int]] | None = None
        # Appends re-tokenize only a context's tail: needs offsets (a fast tokenizer) that
        # splits a text in pieces as it splits the whole (checked once on a sample).
        self._incremental = incremental_tokenization_works(self.tokenizer)
        self._tasks: set[asyncio.Task] = set()
        self._opening: Counter[int] = Counter()  # data parallel: streams opening, by rank

    # ---- public API -------------------------------------------------------------------------

    async def open(
        self,
        sid: str,
        sampling_params: dict[str, Any] | None = None,
        text: str = "",
        input_ids: list[int] | None = None,
    ) -> dict:
        """Open a stream; `text` (or `input_ids`) is an optional first chunk. Returns the
        stream's status. A stream's chunks are all text or all token ids."""
        self._check_new(sid)
        params = self._check_params(sampling_params, sid)
        kind, chunk = self._chunk(sid, text, input_ids)
        stream = await self._new_stream(sid, params)
        if chunk:
            await self._extend(stream, kind, chunk)
        return {**self.status(sid), "stream_token": stream.token}

    async def open_chat(
        self,
        sid: str,
        messages: list[dict[str, Any]],
        context_message: int | None = None,
        text: str = "",
    ) -> dict:
        """Open a chat stream: `messages` (OpenAI chat messages, as dicts), of which the one at
        `context_message` (default: the last) is the streamed context; its content so far plus
        `text` is the first chunk. The context is SGLang's chat template applied to the
        messages; the system and user text before the context message is prefilled at once.
        Sampling parameters come with the finish (the OpenAI chat completion request)."""
        self._check_new(sid)
        self._check_chunk(sid, text)
        if self.chat_renderer is None:
            raise ChatStreamCall("chat streams need SGLang's chat serving (the HTTP server)", sid)
        chat, initial = chat_context(sid, messages, context_message)
        text = initial + text
        self._check_chunk(sid, text)
        # Render once before the stream exists: a template error is the caller's, nothing opens.
        ids = await self._render(sid, chat, text)
        stream = await self._new_stream(sid, None)
        stream.chat, stream.kind = chat, "text"
        async with chat.lock:
            await self._set_context(stream, ids, text=text, chunk=bool(text))
        return {**self.status(sid), "stream_token": stream.token}

    async def append(self, sid: str, text: str = "", input_ids: list[int] | None = None) -> dict:
        """Add `text` (or `input_ids`) at the end of the stream's context; returns at once
        (prefill goes on). On a chat stream the text goes at the end of the context message."""
        stream = self._live(sid)
        kind, chunk = self._chunk(sid, text, input_ids)
        if not chunk:
            raise EmptyChunk("empty chunk: append needs text or input_ids", sid)
        if stream.chat is not None:
            await self._set_chat_text(stream, kind, lambda old: old + chunk)
            return self.status(sid)
        await self._extend(stream, kind, chunk)
        return self.status(sid)

    async def update(self, sid: str, text: str = "", input_ids: list[int] | None = None) -> dict:
        """Replace the stream's whole context by a refined `text` (or `input_ids`)."""
        stream = self._live(sid)
        kind, chunk = self._chunk(sid, text, input_ids)
        if not chunk:
            raise EmptyChunk("empty chunk: update needs the refined context", sid)
        if stream.chat is not None:  # replaces the context message's content
            await self._set_chat_text(stream, kind, lambda old: chunk, replaced=True)
            return self.status(sid)
        self._set_kind(stream, kind)
        if kind == "ids":
            await self._set_context(stream, stream.history + list(chunk), replaced=True)
            return self.status(sid)
        async with stream.lock:
            self._live(stream.sid)  # finished or closed meanwhile: raises why
            ids = await self._tokenized(stream, chunk, appended=False)
            self._live(stream.sid)  # finished or closed meanwhile: raises why
            await self._set_context(stream, ids, text=chunk, replaced=True)
        return self.status(sid)

    async def finish(
        self,
        sid: str,
        text: str = "",
        sampling_params: dict[str, Any] | None = None,
        input_ids: list[int] | None = None,
        keep_open: bool = False,
    ) -> AsyncIterator[dict]:
        """Close the context (with an optional last chunk, text or `input_ids`) and stream the
        output.

        Yields SGLang's output dicts under the stream id; the last one's `meta_info["stream"]`
        holds `ttft_s` (finish to first output token), `unprefilled_at_finish` and the counters.
        With `keep_open`, the stream stays open after the output: the prompt and the generated
        tokens become its fixed history (their KV stays held), the next chunks (a tool's
        result, say) go after them, and the next finish generates again (an agent loop).
        """
        stream = self._live(sid)
        if stream.chat is not None:
            raise ChatStreamCall(
                f"stream {sid!r} is a chat stream: finish it with a chat completion request "
                "(POST /stream/v1/chat/completions)",
                sid,
            )
        params = self._check_params({**stream.sampling_params, **(sampling_params or {})}, sid)
        kind, chunk = self._chunk(sid, text, input_ids)
        t_finish = time.perf_counter()
        if chunk:
            await self._extend(stream, kind, chunk, start_pump=False)
        if not stream.ids:  # the stream stays open: a finish with a chunk can follow
            raise EmptyChunk("cannot finish a stream with an empty context", sid)
        if stream.history and len(stream.ids) == len(stream.history):
            raise EmptyChunk(
                "after a generating turn, finish needs new input (a tool result, a question)", sid
            )
        stream.state = State.FINISHING
        stream.moved.set()  # a settling pump stops waiting
        self._at_finish(stream)
        if stream.kind == "text" and stream.anchor.chars > 0:
            await self._check_incremental(stream)
        return self._generate(stream, t_finish, params, keep_open)

    def reserve_chat_finish(self, sid: str) -> list[dict[str, Any]]:
        """Start finishing a chat stream: no more chunks. Returns its messages with the context
        message's content filled in; the final prompt is SGLang's rendering of these plus the
        finishing request's messages, handed to `finish_chat`. `release_chat_finish` undoes
        this if the final turn never starts (the finishing request was refused)."""
        stream = self._live(sid)
        if stream.chat is None:
            raise NotAChatStream(
                f"stream {sid!r} was opened without messages: it is not a chat stream "
                "(finish it with POST /stream/finish)",
                sid,
            )
        stream.state = State.FINISHING  # the pump stops after the turn in flight
        stream.moved.set()
        self._at_finish(stream)
        return stream.chat.filled(stream.text)

    def release_chat_finish(self, sid: str) -> None:
        """The finish reserved by `reserve_chat_finish` did not start: the stream goes on."""
        stream = self.streams.get(sid)
        if stream is not None and not stream.closed and stream.finishing:
            stream.state = State.OPEN
            stream.pipeline_after = None
            stream.last_activity = time.monotonic()
            if stream.ids != stream.held and (stream.pump is None or stream.pump.done()):
                stream.pump = asyncio.ensure_future(self._pump(stream))

    async def finish_chat(
        self,
        sid: str,
        prompt_ids: list[int],
        base: Any,
        t_finish: float,
        keep_open: bool = False,
    ) -> AsyncIterator[dict]:
        """The final turn of a chat stream reserved by `reserve_chat_finish`: its context
        becomes exactly `prompt_ids` (SGLang's rendering of the final messages); only the tokens
        after the held KV are sent. `base` is SGLang's own `GenerateReqInput` for the final
        messages (sampling parameters, logprob options, ...): the turn is that request with
        the delta as its input and the stream's session. Yields as `finish` does."""
        stream = self._existing(sid)
        if stream.error is not None:
            raise stream.error
        if stream.chat is None or not stream.finishing:
            raise StreamError(f"stream {sid!r} has no chat finish reserved", sid)
        if keep_open:
            raise ChatStreamCall("keep_open is not supported on a chat stream", sid)
        await self._check_length(stream, len(prompt_ids), "prompt")
        stream.ids = list(prompt_ids)
        return self._generate(stream, t_finish, dict(base.sampling_params or {}), False, base)

    async def abort(self, sid: str, reason: str = "aborted by client") -> None:
        """Abort a stream: the turn in flight is aborted and the session's KV freed."""
        stream = self._existing(sid)
        await self._close(stream, f"aborted: {reason}")

    async def set_policy(self, name: str, timeout_s: float = 30.0) -> dict:
        """Switch the scheduler's stream policy; returns once the scheduler reports it.

        A ValueError for an unknown name; a TimeoutError if the scheduler does not report the
        new policy within `timeout_s` seconds.
        """
        from s2l_sglang.messages import SetStreamPolicyReq
        from s2l_sglang.sched.policy import get_policy

        get_policy(name)  # a clear error before anything is sent
        self.tm._dispatch_to_scheduler(SetStreamPolicyReq(policy=name))
        await self._until_reported("policy", name, timeout_s)
        return {"policy": name}

    async def set_publish_at_close(self, on: bool, timeout_s: float = 30.0) -> dict:
        """Switch `publish_at_close` (whether a closing stream's KV stays in the radix tree as
        cache) from the scheduler's next close on; returns once the scheduler reports it. A
        TimeoutError as `set_policy`."""
        from s2l_sglang.messages import SetPublishAtCloseReq

        if not isinstance(on, bool):
            raise TypeError(f"publish_at_close must be True or False: {on!r}")
        self.tm._dispatch_to_scheduler(SetPublishAtCloseReq(on=on))
        await self._until_reported("publish_at_close", on, timeout_s)
        return {"publish_at_close": on}

    async def _until_reported(self, key: str, value: Any, timeout_s: float) -> None:
        """Wait until the scheduler's `s2l_sched` state reports `key` as `value`."""
        deadline = time.monotonic() + timeout_s
        while True:
            counters = sched_counters_from(await self.tm.get_internal_state()) or {}
            if key in counters and counters[key] == value:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler did not report {key} = {value!r}")
            await asyncio.sleep(0.02)

    def authorize(self, sid: str, token: str | None) -> None:
        """An HTTP call on stream `sid` must carry its token (returned by open): Forbidden
        (403) otherwise; UnknownStream / StreamClosed for a stream that is not live."""
        stream = self._existing(sid)
        if not isolation.token_matches(stream.token, token):
            raise Forbidden(
                f"stream {sid!r}: missing or wrong {isolation.TOKEN_HEADER} "
                "(the stream_token its open returned)",
                sid,
            )

    async def wait_closed(self, sid: str) -> str:
        """Wait until stream `sid` has ended; returns how it ended."""
        stream = self.streams.get(sid)
        if stream is not None:
            await stream.ended.wait()
        return self._ended.get(sid, "ended")

    def session_key(self, sid: str) -> str:
        """The SGLang session id of live stream `sid` (for the chat finish's rid)."""
        stream = self._existing(sid)
        return stream.key

    def status(self, sid: str) -> dict:
        stream = self._existing(sid)
        return {
            "stream_id": sid,
            "context_tokens": len(stream.ids),
            "held_tokens": len(stream.held),
            "history_tokens": len(stream.history),
            "complete": stream.complete,
            "dp_rank": stream.dp_rank,
            **stream.counters.as_dict(),
        }

    async def wait_prefilled(self, sid: str) -> dict:
        """Wait until the engine holds the stream's whole context so far (no turn in flight or
        due); returns its status. Raises the stream's error if its prefill failed."""
        stream = self._existing(sid)
        while stream.pump is not None and not stream.pump.done():
            await asyncio.wait({stream.pump})
        if stream.error is not None:
            raise stream.error
        return self.status(sid)

    # ---- internals --------------------------------------------------------------------------

    def _check_new(self, sid: str) -> None:
        if not isinstance(sid, str) or not STREAM_ID.fullmatch(sid):
            raise InvalidStreamId(
                f"invalid stream id {sid!r}: 1 to 128 of A-Z a-z 0-9 . _ ~ -",
                sid if isinstance(sid, str) else None,
            )
        if sid in self.streams or sid in self._ended:
            raise DuplicateStream(f"stream {sid!r} already exists", sid)

    def _check_params(self, params: Any, sid: str) -> dict[str, Any]:
        """Sampling parameters checked with SGLang's own class, before any engine work."""
        return check_sampling_params(
            params,
            self.tm.sampling_params_class,
            self.tokenizer,
            int(self.tm.model_config.vocab_size),
            sid,
        )

    async def _new_stream(self, sid: str, sampling_params: dict[str, Any] | None) -> Stream:
        """Open the stream's streaming session and register the stream."""
        self._check_new(sid)
        self._ensure_reaper()
        from sglang.srt.managers.io_struct import OpenSessionReqInput

        key = isolation.new_key(sid)
        isolation.live_keys.add(key)
        rank = self._choose_rank()  # before the wait: streams opening meanwhile count too
        if rank is not None:
            self._opening[rank] += 1
        try:
            result = await self.tm.open_session(
                OpenSessionReqInput(capacity_of_str_len=1 << 30, session_id=key, streaming=True)
            )
        except BaseException:  # cancelled or failed: a session may be open, close it
            await self._close_session(key)
            raise
        finally:
            if rank is not None:
                self._opening[rank] -= 1
        if result is None or sid in self.streams:  # the same id opened concurrently
            await self._close_session(key)
            raise DuplicateStream(f"stream {sid!r} already exists", sid)
        now = time.monotonic()
        stream = Stream(sid, dict(sampling_params or {}), now, key=key, last_activity=now)
        stream.token = isolation.new_token()
        stream.dp_rank = rank
        self.streams[sid] = stream
        return stream

    def _choose_rank(self) -> int | None:
        """With data parallelism (`--dp-size N`, no DP attention): the rank a new stream's
        turns all go to (`routed_dp_rank`; SGLang opens and closes a session on every rank).
        The rank with the fewest streams of ours (each pins KV between turns), then the fewest
        running and waiting requests (SGLang's load snapshots). None without DP."""
        args = getattr(self.tm, "server_args", None)
        ranks = int(getattr(args, "dp_size", 1) or 1)
        if ranks <= 1 or getattr(args, "enable_dp_attention", False):
            return None
        mine = [self._opening[r] for r in range(ranks)]
        for other in self.streams.values():
            if other.dp_rank is not None and other.dp_rank < ranks:
                mine[other.dp_rank] += 1
        busy = [0] * ranks
        try:
            for load in self.tm.load_snapshot_reader.read_all():
                if 0 <= load.dp_rank < ranks:
                    busy[load.dp_rank] = load.num_running_reqs + load.num_waiting_reqs
        except Exception:  # no snapshots (yet): by our own streams alone
            logger.debug("no DP load snapshots", exc_info=True)
        return min(range(ranks), key=lambda r: (mine[r], busy[r], r))

    async def _close_session(self, key: str) -> None:
        """Close SGLang session `key` (deferred by SGLang until a turn in flight ends)."""
        from sglang.srt.managers.io_struct import CloseSessionReqInput

        isolation.closing.add(key)
        try:
            await self.tm.close_session(CloseSessionReqInput(session_id=key))
        finally:
            isolation.closing.discard(key)
            isolation.live_keys.discard(key)

    async def _render(self, sid: str, chat: ChatContext, text: str) -> list[int]:
        """A chat stream's context ids: SGLang's chat template over the messages with the
        context message's content = `text` (off the event loop: long contexts take a while)."""
        try:
            return list(await asyncio.to_thread(self.chat_renderer, chat.filled(text)))
        except StreamError:
            raise
        except (ValueError, TypeError) as exc:  # template and validation errors
            raise InvalidMessages(
                f"the chat template cannot render the messages: {exc}", sid
            ) from exc

    async def _set_chat_text(
        self, stream: Stream, kind: str, new_text, replaced: bool = False
    ) -> None:
        """Set a chat stream's context message content to `new_text(old)` and re-render."""
        if kind != "text":
            raise ChatStreamCall("a chat stream takes text chunks, not input_ids", stream.sid)
        async with stream.chat.lock:  # one render at a time: chunks apply in call order
            if stream.closed or stream.finishing:
                self._live(stream.sid)  # raises the reason
            text = new_text(stream.text)
            self._check_chunk(stream.sid, text)
            ids = await self._render(stream.sid, stream.chat, text)
            if stream.closed or stream.finishing:  # finished or aborted meanwhile
                self._live(stream.sid)
            await self._set_context(stream, ids, text=text, replaced=replaced)

    def _existing(self, sid: str) -> Stream:
        """Live stream `sid`; UnknownStream, or StreamClosed for one that has ended."""
        stream = self.streams.get(sid)
        if stream is None:
            self._raise_missing(sid)
        return stream

    def _live(self, sid: str) -> Stream:
        stream = self._existing(sid)
        if stream.error is not None:
            raise stream.error
        if stream.finishing:
            raise StreamClosed(f"stream {sid!r} is finished: no more chunks", sid)
        stream.last_activity = time.monotonic()
        return stream

    def _raise_missing(self, sid: str):
        if sid in self._ended:
            raise StreamClosed(f"stream {sid!r} has ended ({self._ended[sid]})", sid)
        raise UnknownStream(f"unknown stream {sid!r}", sid)

    def _check_chunk(self, sid: str, text: Any) -> None:
        if not isinstance(text, str):
            raise StreamError(f"a chunk must be a string, not {type(text).__name__}", sid)
        if len(text) > self.max_chunk_chars:
            raise StreamError(f"chunk larger than {self.max_chunk_chars} characters", sid)

    def _chunk(self, sid: str, text: Any, input_ids: Any) -> tuple[str, str | list[int]]:
        """A call's chunk, checked: ("text", str) or ("ids", list of ids in the vocabulary)."""
        if input_ids is None:
            self._check_chunk(sid, text)
            return "text", text
        if text:
            raise MixedInput("give text or input_ids, not both", sid)
        if not isinstance(input_ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in input_ids
        ):
            raise InvalidTokenIds("input_ids must be a list of integers", sid)
        vocab = int(self.tm.model_config.vocab_size)
        bad = next((i for i in input_ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise InvalidTokenIds(f"token id {bad} is outside the vocabulary [0, {vocab})", sid)
        return "ids", input_ids

    @staticmethod
    def _set_kind(stream: Stream, kind: str) -> None:
        if stream.kind is None:
            stream.kind = kind
        elif stream.kind != kind:
            raise MixedInput(
                f"stream {stream.sid!r} takes {'token ids' if stream.kind == 'ids' else 'text'};"
                " a stream does not mix text and token ids",
                stream.sid,
            )

    async def _extend(
        self, stream: Stream, kind: str, chunk: str | list[int], start_pump: bool = True
    ) -> None:
        """Append a checked chunk to the stream's context."""
        self._set_kind(stream, kind)
        if kind == "ids":
            await self._set_context(stream, stream.ids + list(chunk), start_pump=start_pump)
            return
        async with stream.lock:
            self._live(stream.sid)  # finished or closed meanwhile: raises why
            text = stream.text + chunk
            ids = await self._tokenized(stream, text)
            self._live(stream.sid)  # finished or closed meanwhile: raises why
            await self._set_context(stream, ids, text=text, start_pump=start_pump)

    async def _tokenized(self, stream: Stream, text: str, appended: bool = True) -> list[int]:
        """`_tokenize_context`, off the event loop when there is much to tokenize (a 1 MB
        chunk takes about a second: other streams and /health would wait that long)."""
        todo = len(text) - (stream.anchor.chars if appended and self._incremental else 0)
        if todo < OFF_LOOP_CHARS:
            return self._tokenize_context(stream, text, appended)
        return await asyncio.to_thread(self._tokenize_context, stream, text, appended)

    async def _set_context(
        self,
        stream: Stream,
        ids: list[int],
        text: str = "",
        start_pump: bool = True,
        chunk: bool = True,
        replaced: bool = False,
    ) -> None:
        """The stream's context is now `ids` (of `text`, for a text stream); the pump sends it.
        `replaced`: an update; what it rewrote of the previous version is the volatile tail."""
        await self._check_length(stream, len(ids))
        now = time.monotonic()
        if replaced and self.config.hold_back:
            stream.volatile_from = lcp(stream.ids, ids)
            stream.update_gap = max(stream.update_gap, now - stream.last_chunk_at)
        stream.text, stream.ids = text, ids
        stream.counters.chunks += int(chunk)
        stream.last_chunk_at = now
        stream.moved.set()
        self._cancel_if_superseded(stream)
        if start_pump and (stream.pump is None or stream.pump.done()):
            stream.pump = asyncio.ensure_future(self._pump(stream))

    async def _check_length(self, stream: Stream, tokens: int, what: str = "context") -> None:
        """Abort the stream (its KV freed) and raise ContextTooLong if `tokens` do not fit."""
        if tokens >= self.context_len:
            await self._close(stream, "context too long")
            raise ContextTooLong(
                f"{what} of {tokens} tokens exceeds the model's {self.context_len - 1}; "
                "stream aborted",
                stream.sid,
            )

    def _cancel_if_superseded(self, stream: Stream) -> None:
        """Ask the scheduler to cancel the stream's prefill turn in flight if the new context
        drops more than CANCEL_MIN_TOKENS, and at least half, of the new tokens that turn
        prefills (an update rewrote them): that work would be thrown away, and a final context
        would wait for it. The scheduler cancels it only while it waits in the queue without
        the session's KV (`CancelStaleTurnReq`); otherwise it runs to its end as before."""
        rid, target = stream.inflight_rid, stream.inflight_target
        if rid is None or target is None or is_final(rid) or stream.cancelled_rid == rid:
            return
        new = len(target) - stream.inflight_keep
        lost = len(target) - max(lcp(target, stream.ids), stream.inflight_keep)
        if lost > CANCEL_MIN_TOKENS and 2 * lost >= new:
            self._cancel(stream, rid, for_final=False)

    def _at_finish(self, stream: Stream) -> None:
        """The context is final. With a prefill turn in flight, the final turn is either sent
        at once, built on that turn (pipelined: the scheduler keeps it until that turn has
        ended, then hands it to the next step, and promotes that turn if it still waits), or,
        when pipelining is off, on a PD prefill instance, or after that turn was sent a
        stale-turn cancel, sent after it (`_promote_inflight`)."""
        rid = stream.inflight_rid
        if (
            self.config.pipelined_finish
            and self.final_outputs is None
            and rid is not None
            and not is_final(rid)
            and stream.cancelled_rid != rid
        ):
            stream.pipeline_after = rid
            return
        self._promote_inflight(stream)

    def _promote_inflight(self, stream: Stream) -> None:
        """At the finish: a prefill turn still queued is speculative work, ordered after all
        committed work; the final turn would wait behind it. It is cancelled instead (only
        while it waits without the session's KV: nothing of it was computed), and the final
        turn, committed work, carries its tokens. One that waits on the session's KV cannot
        be cancelled: the scheduler promotes it to committed work. One that already runs is
        awaited: at most one speculative chunk. A turn already sent a stale-turn cancel gets
        the finishing message too (that cancel may have found it on the session's KV)."""
        rid = stream.inflight_rid
        if rid is None or is_final(rid):
            return
        if stream.cancelled_rid != rid:
            self._cancel(stream, rid, for_final=True)
        elif not stream.cancel_for_final:  # its counters stay those of the stale-turn cancel
            self._spawn(self._send_cancel(stream, rid, finishing=True))

    def _cancel(self, stream: Stream, rid: str, for_final: bool) -> None:
        stream.cancelled_rid, stream.cancel_for_final = rid, for_final
        self._spawn(self._send_cancel(stream, rid, finishing=for_final))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_cancel(self, stream: Stream, rid: str, finishing: bool) -> None:
        """Send `CancelStaleTurnReq` once the turn has gone to the scheduler. Best effort: a
        cancel that arrives before the turn, or after it started, changes nothing."""
        from s2l_sglang.messages import CancelStaleTurnReq

        if await self._turn_sent(stream, rid):
            self.tm._dispatch_to_scheduler(CancelStaleTurnReq(rid=rid, finishing=finishing))

    async def _turn_sent(self, stream: Stream, rid: str) -> bool:
        """Wait until prefill turn `rid` has gone to the scheduler: SGLang's tokenizer manager
        registers a request just before sending it, and messages reach the scheduler in order.
        True if the turn is still in flight then."""
        states = getattr(self.tm, "rid_to_state", None)
        for _ in range(1000):  # the gap is one tokenizer-manager step: microseconds to ms
            if stream.inflight_rid != rid:
                return False
            if states is None or rid in states:
                await asyncio.sleep(0)  # let the registering task send the turn first
                return stream.inflight_rid == rid
            await asyncio.sleep(0.001)
        return False

    def _tokenize_context(self, stream: Stream, text: str, appended: bool = True) -> list[int]:
        """The ids of a text stream's context: `text` alone as SGLang would tokenize it, or,
        after a generating turn, the history followed by `text`'s own tokens (no special
        tokens: a BOS belongs at the start of the prompt only).

        `appended`: `text` extends the stream's current text; then only its last tokens are
        re-tokenized (from `stream.anchor`, with a fast tokenizer), so an append costs its own
        length, not the context's. The finish checks the result against the whole text."""
        if not appended or not text.startswith(stream.text):
            stream.anchor = Anchor(0, len(stream.history))
        if not self._incremental:
            return self._exact_ids(stream, text)
        head = stream.ids[: stream.anchor.tokens] if stream.anchor.chars else stream.history
        ids, stream.anchor = tokenize_from(
            self.tokenizer, text, stream.anchor, head, special=not stream.history
        )
        return ids

    def _exact_ids(self, stream: Stream, text: str) -> list[int]:
        """The context's ids from the whole text (what `_tokenize_context` must equal)."""
        if not stream.history:
            return self._tokenize(text)
        return stream.history + list(self.tokenizer.encode(text, add_special_tokens=False))

    async def _check_incremental(self, stream: Stream) -> None:
        """At the finish: the context's ids must be the whole text's. Should a tokenizer split
        differently in pieces, its streams re-tokenize whole texts from now on, and this one's
        final turn rolls back what differs (the prompt is exact either way)."""
        exact = self._exact_ids(stream, stream.text)
        if exact != stream.ids:
            logger.warning(
                "incremental tokenization differs from the whole text's for stream %r; "
                "re-tokenizing whole texts from now on",
                stream.sid,
            )
            self._incremental = False
            await self._check_length(stream, len(exact))
            stream.ids = exact

    def _tokenize(self, text: str) -> list[int]:
        """The ids SGLang gives the same text sent to `/generate`: its tokenizer manager calls
        the tokenizer with its defaults, special tokens included (a BOS for Llama-3), through
        `tokenizer(texts)` for a fast tokenizer and `encode` otherwise (`_tokenize_texts`)."""
        if getattr(self.tokenizer, "is_fast", False):
            return list(self.tokenizer(text)["input_ids"])
        return list(self.tokenizer.encode(text))

    async def _pump(self, stream: Stream) -> None:
        """Prefill turns until the held tokens match the latest text (or the stream finishes)."""
        try:
            while not stream.closed and not stream.finishing:
                plan = next_turn(stream.held, stream.ids, self.page_size)
                if plan is None:
                    return
                plan, volatile = self._hold_back(stream, plan)
                if volatile and await self._settle(stream):
                    continue  # the context moved meanwhile, or the stream finished
                cap = self.config.speculative_chunk
                if len(plan.delta) > cap:  # preemptible between turns: see speculative_chunk
                    cap = max(cap - cap % self.page_size, self.page_size)  # whole pages
                    plan = plan._replace(delta=plan.delta[:cap])
                n = stream.counters.turns
                rid = volatile_rid(stream.key, n) if volatile else turn_rid(stream.key, n)
                await self._turn(stream, plan, PREFILL_ONLY, rid)
        except Exception as exc:  # a failed turn ends the stream: its KV is freed at once
            stream.error = engine_error(exc, stream.sid)
            await self._close(stream, f"aborted: {stream.error}")

    async def _settle(self, stream: Stream) -> bool:
        """Before a volatile tail's turn: wait until the stream has been quiet for SETTLE_GAPS
        times the longest gap between its versions (at most `hold_back_settle` seconds after
        its last one). Refinements that come in a burst (the ANN workload sends its first
        versions within 0.3 s, the last seconds later) then rewrite tails nobody prefilled.
        True if something happened meanwhile (a new version, a finish, a close)."""
        quiet = min(self.config.hold_back_settle, SETTLE_GAPS * stream.update_gap)
        wait = stream.last_chunk_at + quiet - time.monotonic()
        if wait <= 0:
            return False
        stream.moved.clear()
        try:
            await asyncio.wait_for(stream.moved.wait(), wait)
        except TimeoutError:
            return False
        return True

    def _hold_back(self, stream: Stream, plan: Turn) -> tuple[Turn, bool]:
        """Update mode: a turn sends the stable prefix (shared with the version before) first,
        at speculative priority; the volatile tail after it goes as its own turns, marked for
        the lowest priority (rid.volatile_rid): prefilled only with budget nobody else wants,
        and cancelled rather than finished if a newer version drops it. Returns the turn and
        whether it is volatile."""
        start = stream.volatile_from
        if start is None:
            return plan, False
        cut = start - plan.keep
        cut -= cut % self.page_size
        if cut <= 0:
            return plan, True
        if cut < len(plan.delta):
            plan = plan._replace(delta=plan.delta[:cut])
        return plan, False

    async def _turn(
        self,
        stream: Stream,
        plan: Turn,
        sampling_params: dict,
        rid: str,
        sink=None,
        base=None,
        after: tuple[str, list[int]] | None = None,
    ) -> dict:
        """One engine turn. `base`: a `GenerateReqInput` built by SGLang (the OpenAI layer's)
        to send as this turn instead of a fresh one (its other options are kept). `after`: a
        final turn built on the prefill turn in flight, (its rid, the ids the session holds
        once it ends), sent without waiting for it; raises `Rebased` if the scheduler sends
        it back (that turn did not finish)."""
        from sglang.srt.managers.io_struct import GenerateReqInput

        session_params: dict[str, Any] = {"id": stream.key}
        if plan.rollback:
            session_params.update(replace=True, offset=plan.keep)
        if after is not None:  # the scheduler checks it against the session's last turn
            session_params["rid"] = after[0]
        fields = dict(
            input_ids=plan.delta,
            sampling_params=sampling_params,
            rid=rid,
            session_params=session_params,
            stream=sink is not None,
        )
        if stream.dp_rank is not None:  # data parallel: the rank that holds the session's KV
            fields["routed_dp_rank"] = stream.dp_rank
        if base is None:
            obj = GenerateReqInput(**fields)
        else:
            obj = base
            for name, value in fields.items():
                setattr(obj, name, value)
            obj.text, obj.session_id = None, None
        target = (stream.held if after is None else after[1])[: plan.keep] + plan.delta
        if after is None:
            stream.inflight_rid, stream.inflight_target = rid, target
            stream.inflight_keep = plan.keep
        else:
            stream.pipelined_rid = rid
        stream.counters.turns += 1
        out: dict = {}
        ended = False
        isolation.own_rids.add(rid)
        try:
            if self.final_outputs is not None and is_final(rid):
                outputs = self.final_outputs(obj, target)
            else:
                outputs = self.tm.generate_request(obj, None)
            async for out in outputs:
                if sink is not None:
                    await sink(out)
            ended = True
        except Exception as exc:  # SGLang's errors (400s, 503s) and ours (a stalled reader)
            raise engine_error(exc, stream.sid) from exc
        finally:
            isolation.own_rids.discard(rid)
            if not ended:  # an error or a cancel here: the engine stops the turn too
                self.tm.abort_request(rid=rid)
            if after is None:
                stream.inflight_rid, stream.inflight_target = None, None
            else:
                stream.pipelined_rid = None
            stream.last_activity = time.monotonic()  # the idle clock starts when engine work ends
        meta = out.get("meta_info", {})
        reason = meta.get("finish_reason") or {}
        if reason.get("type") == "abort":
            if stream.cancelled_rid == rid and reason.get("message") == CANCELLED:
                return self._cancelled(stream, plan)
            if after is not None and reason.get("message") == REBASE:
                raise Rebased(rid)
            err = StreamError(f"turn aborted: {reason.get('message', '')}", stream.sid)
            if isinstance(reason.get("status_code"), int) and reason["status_code"] >= 500:
                err = EngineError(str(err), stream.sid)  # overload, timeouts: the engine's
                err.status = reason["status_code"]
            raise err
        if stream.cancelled_rid == rid:  # it ended before the abort reached it
            stream.cancelled_rid = None
        if after is not None and stream.pump is not None:  # the turn before, as committed
            await asyncio.wait({stream.pump})
        # a final turn merged with the turn it was built on keeps what that turn would have
        # held: only what the session held before that turn can be invalidated here
        invalidated = max(0, len(stream.held) - plan.keep)
        stream.held = target
        prompt, cached = meta.get("prompt_tokens", len(target)), meta.get("cached_tokens", 0)
        delta = StreamCounters(prefilled=prompt - cached, reused=cached, invalidated=invalidated)
        if not is_final(rid):
            delta.speculative = delta.prefilled
        if is_volatile(rid):
            delta.held_back = delta.prefilled
        self._count(stream, delta)
        return out

    def _count(self, stream: Stream, delta: StreamCounters) -> None:
        stream.counters.add(delta)
        self.totals.add(delta)

    def _cancelled(self, stream: Stream, plan: Turn) -> dict:
        """A prefill turn the scheduler cancelled while it waited: the session holds what it
        held before the turn, cut to `plan.keep` if the turn rolled it back (done as SGLang
        created the turn's request, before it queued)."""
        stream.cancelled_rid = None
        if stream.cancel_for_final:
            delta = StreamCounters(promoted=len(plan.delta))
        else:
            delta = StreamCounters(cancelled=len(plan.delta))
        if plan.rollback:
            delta.invalidated = len(stream.held) - plan.keep
            stream.held = stream.held[: plan.keep]
        self._count(stream, delta)
        return {}

    async def _generate(
        self,
        stream: Stream,
        t_finish: float,
        sampling_params: dict | None,
        keep_open: bool,
        base: Any = None,
    ) -> AsyncIterator[dict]:
        """The finish's outputs, read from the final turn's bounded queue. The final turn is a
        task of the manager's own (`_final`): it releases the stream's KV when generation ends,
        whatever the reader does; a reader that goes away aborts it."""
        params = dict(stream.sampling_params)
        params.update(sampling_params or {})
        outputs: asyncio.Queue = asyncio.Queue(maxsize=OUTPUT_QUEUE)
        task = asyncio.ensure_future(
            self._final(stream, t_finish, params, keep_open, base, outputs)
        )
        done = False
        getter: asyncio.Future | None = None
        try:
            while True:
                getter = asyncio.ensure_future(outputs.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                    continue
                getter.cancel()
                if outputs.empty():
                    break
            done = True
            task.result()  # re-raise a failed final turn
        finally:
            if getter is not None and not getter.done():
                getter.cancel()
            if not done and not task.done():  # the reader left: disconnect, cancelled, closed
                await self._close(stream, "aborted: client disconnected")
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _final(
        self,
        stream: Stream,
        t_finish: float,
        params: dict,
        keep_open: bool,
        base: Any,
        outputs: asyncio.Queue,
    ) -> None:
        """The final turn: waits for the prefill turn in flight, sends the rest of the context
        with the sampling parameters, and puts each output in `outputs` (the last one carries
        `meta_info["stream"]`). The session is closed as soon as generation ends."""
        try:
            t0 = time.perf_counter()
            after = await self._pipeline(stream)
            if after is None and stream.pump is not None:
                await stream.pump  # the turn in flight; the pump stops after it
            waited = time.perf_counter() - t0
            plan = self._final_plan(stream, stream.held if after is None else after[1])
            unprefilled = len(plan.delta)
            first: list[float] = []
            pending: list[dict] = []  # the latest output: the last one is annotated below

            async def sink(out: dict) -> None:
                if not first and out.get("output_ids"):
                    first.append(time.perf_counter() - t_finish)
                if pending:
                    await self._put(stream, outputs, pending.pop())
                pending.append(self._as_stream_output(stream, out))

            rid = final_rid(stream.key, stream.generations)
            promoted = stream.counters.promoted
            try:
                final = await self._turn(stream, plan, params, rid, sink, base, after)
                carried = stream.counters.promoted - promoted
                if after is not None and carried:  # merged with the turn it was built on
                    # that turn's tokens the final turn kept were not prefilled either: the
                    # session held `base` tokens, what that turn was appended to
                    base = len(after[1]) - carried
                    unprefilled += max(0, plan.keep - base)
            except Rebased:  # the turn it was built on did not finish: again, on what is held
                pending.clear()
                if stream.pump is not None:
                    await stream.pump
                plan = self._final_plan(stream, stream.held)
                unprefilled = len(plan.delta)
                final = await self._turn(stream, plan, params, rid, sink, base)
            # what the final turn itself prefilled bounds it: its tokens that SGLang found in
            # the prefix cache (another request's KV of the same text) were not left to do
            unprefilled = min(unprefilled, _prefilled_by(final, unprefilled))
            if keep_open:  # before the last output reaches the client, who may go on at once
                self._keep_open(stream, list(final.get("output_ids") or []))
            else:  # generation ended: the KV goes now, not when the reader is done
                await self._close(stream, "finished")
            last = dict(pending.pop() if pending else self._as_stream_output(stream, final))
            last["meta_info"] = dict(last.get("meta_info", {}))
            last["meta_info"]["stream"] = {
                "ttft_s": first[0] if first else time.perf_counter() - t_finish,
                "unprefilled_at_finish": unprefilled,
                "waited_for_turn_s": waited,
                "kept_open": keep_open,
                **stream.counters.as_dict(),
            }
            await self._put(stream, outputs, last)
        except BaseException as exc:
            if not stream.closed:
                reason = "reader stalled" if isinstance(exc, ReaderStalled) else "finish failed"
                await self._close(stream, f"aborted: {reason}")
            raise

    async def _pipeline(self, stream: Stream) -> tuple[str, list[int]] | None:
        """A pipelined finish (`_at_finish`): (the rid of the prefill turn in flight, the ids
        the session holds once it ends), once that turn has gone to the scheduler; None if
        the finish is not pipelined or the turn ended meanwhile."""
        rid, stream.pipeline_after = stream.pipeline_after, None
        if rid is None or stream.inflight_rid != rid or stream.inflight_target is None:
            return None
        target = list(stream.inflight_target)
        if not await self._turn_sent(stream, rid):
            return None
        # the scheduler cancels that turn if it still waits in the queue, and the final turn
        # carries its tokens (`StreamScheduling.merge_into_final`): counted as promoted
        if stream.cancelled_rid != rid:  # (unless a stale-turn cancel went meanwhile)
            stream.cancelled_rid, stream.cancel_for_final = rid, True
        return rid, target

    def _final_plan(self, stream: Stream, held: list[int]) -> Turn:
        """The final turn from `held` (what the session holds when it runs) to the context."""
        if stream.error is not None:
            raise stream.error
        if not stream.ids:
            raise EmptyChunk("cannot finish a stream with an empty context", stream.sid)
        plan = next_turn(held, stream.ids, self.page_size, need_input=True)
        if plan.keep < len(stream.history):  # only with page_size > 1
            raise StreamError("a kept-open stream needs page size 1", stream.sid)
        return plan

    async def _put(self, stream: Stream, outputs: asyncio.Queue, out: dict) -> None:
        """Hand one output to the finish's reader; a reader that takes nothing for the idle
        timeout is dropped (ReaderStalled: the final turn is aborted, its KV freed)."""
        wait = self.idle_timeout if self.idle_timeout is not None else STALLED_READER_S
        try:
            await asyncio.wait_for(outputs.put(out), timeout=wait)
        except TimeoutError:
            raise ReaderStalled(
                f"the reader of stream {stream.sid!r} took no output for {wait:g} s", stream.sid
            ) from None

    @staticmethod
    def _keep_open(stream: Stream, output_ids: list[int]) -> None:
        """After a generating turn of a stream kept open: SGLang's streaming session carries
        the turn's output into the next turn's prompt, so prompt + output is the new history."""
        stream.history = stream.held + output_ids
        stream.anchor = Anchor(0, len(stream.history))
        stream.held = list(stream.history)
        stream.ids = list(stream.history)
        stream.text = ""
        stream.generations += 1
        stream.volatile_from = None  # the history is fixed: nothing of it is volatile
        stream.state = State.OPEN
        stream.last_activity = time.monotonic()

    @staticmethod
    def _as_stream_output(stream: Stream, out: dict) -> dict:
        out = dict(out)
        meta = dict(out.get("meta_info", {}))
        meta["id"] = stream.sid
        out["meta_info"] = meta
        return out

    async def _close(self, stream: Stream, reason: str) -> None:
        if stream.closed:
            return
        stream.state = State.CLOSED
        stream.moved.set()
        stream.ended.set()
        self.streams.pop(stream.sid, None)
        self._ended[stream.sid] = reason
        while len(self._ended) > 100_000:
            self._ended.popitem(last=False)
        for rid in (stream.inflight_rid, stream.pipelined_rid):
            if rid is not None:
                self.tm.abort_request(rid=rid)
        # Closing with a turn in flight is deferred by SGLang until that turn ends.
        await self._close_session(stream.key)

    def _ensure_reaper(self) -> None:
        if self.idle_timeout is None or (self._reaper is not None and not self._reaper.done()):
            return
        self._reaper = asyncio.ensure_future(self._reap_idle())

    async def _reap_idle(self) -> None:
        """Abort streams left quiet for `idle_timeout` seconds (KV freed).

        Quiet means no client call and no turn in flight: a slow prefill never counts as the
        client's silence.
        """
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout / 4))
            now = time.monotonic()
            for stream in list(self.streams.values()):
                quiet = stream.inflight_rid is None and not stream.finishing
                if quiet and now - stream.last_activity > self.idle_timeout:
                    try:
                        await self._close(stream, f"aborted: idle for {self.idle_timeout:g} s")
                    except Exception:  # one failed close must not end the reaping of others
                        logger.exception("closing idle stream %r failed", stream.sid)


def sched_counters_from(states: Any) -> dict | None:
    """The plugin's `s2l_sched` entry in SGLang's internal states (one per scheduler), if any."""
    for state in states or []:
        if isinstance(state, dict) and isinstance(state.get("s2l_sched"), dict):
            return dict(state["s2l_sched"])
    return None


def _prefilled_by(out: dict, default: int) -> int:
    """The prompt tokens a finished turn prefilled (its prompt less SGLang's cached tokens, as
    `_turn` counts them), or `default` where its output does not say."""
    meta = out.get("meta_info") or {}
    prompt, cached = meta.get("prompt_tokens"), meta.get("cached_tokens")
    if not isinstance(prompt, int) or not isinstance(cached, int):
        return default
    return max(0, prompt - cached)
