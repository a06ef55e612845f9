"""The configuration of stream2llm-sglang: one frozen object, built once, validated at start-up.

`StreamConfig` is built from `s2l serve`'s own flags (`add_arguments` / `from_args`) or from
`StreamEngine(...)` arguments. It reaches SGLang's other processes (scheduler, detokenizer) on
SGLang's own arguments: `attach(server_args, config)` stores it on the `ServerArgs` record as
the bookkeeping attribute `_s2l_config` (the way SGLang itself records `_launch_command`), which
SGLang pickles into every process it starts; `of_server_args(server_args)` reads it back there.
A server started without our launcher (plain `sglang serve` with the plugin installed) gets the
defaults. Nothing is passed through environment variables.

At run time two settings can change: the stream policy (`StreamEngine.set_stream_policy`,
`POST /stream/policy`) and `publish_at_close` (`StreamEngine.set_publish_at_close`, for A/B
runs on one engine); see `s2l_sglang/plugin.py`.

Two environment variables are read (never written) for locations, like `XDG_CACHE_HOME`:
`S2L_CACHE_DIR` (converted model, workload caches) and `S2L_PROFILE_DIR` (saved cost profiles).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

_ATTR = "_s2l_config"

#: `speculative_chunk`'s default by device. CPU: measured on the 2-core host (bfloat16, the
#: crawler at 0.4 QPS, two seeds x 3 interleaved repeats each, bench/results/README.md
#: "speculative_chunk 256 on a CPU"): against SGLang's streaming sessions in the same runs,
#: 256 over 512 was 1.03x [0.96, 1.10] at p50, 1.13x [1.03, 1.27] at p95, 1.21x [1.01, 1.41]
#: at p99; at 1.0 QPS 512 was no better against prefix warming and 0.92x [0.74, 0.98] of 256's
#: speedup over waiting at p50 ("crawler-cap512-r3-01fc975"). 256 is also about where a
#: step's tokens cost as much as its fixed part there (62-64 ms + 0.27-0.28 ms a token:
#: 218-239 tokens, `python -m bench.prefill_probe`). GPU: 512, the earlier default on every
#: device; no GPU run has measured it. A saved profile that recorded its prefill step gives
#: the chunk instead (`with_measured_chunk`).
SPECULATIVE_CHUNK_CPU = 256
SPECULATIVE_CHUNK_GPU = 512


#: the host pool's default budget for swapped KV, in bytes: vLLM's default CPU swap space
#: (`--swap-space 4`, GiB). In tokens it depends on the model: 186,413 of SmolLM2-135M in
#: bfloat16 (23,040 bytes a token), 32,768 of an 8B Llama (131,072). The pool takes host memory
#: only for the copies it holds. Under memory pressure its size decides whether swapped streams
#: come back (bench/results/README.md: ANN's p99 over waiting in `memory-pressure-tails` was
#: 0.95-1.02x with a host pool of the device pool's 3,072 tokens, the default until
#: 2026-12-07, and 2.31-3.20x with this one, "memory-pressure-tails-3b645ec").
HOST_KV_BYTES = 4 << 30


def default_host_kv_tokens(kv_bytes_per_token: int) -> int:
    """`host_kv_tokens` when none is given: as many tokens as `HOST_KV_BYTES` holds."""
    return HOST_KV_BYTES // max(1, kv_bytes_per_token)


def default_speculative_chunk() -> int:
    """`speculative_chunk` when none is given: 256 on a CPU host, 512 on a GPU."""
    from s2l_sglang.defaults import is_cpu_host

    return SPECULATIVE_CHUNK_CPU if is_cpu_host() else SPECULATIVE_CHUNK_GPU


@dataclass(frozen=True)
class StreamConfig:
    """Every setting of ours, for the server, the in-process engine and the scheduler."""

    #: order of SGLang's waiting queue: `default` (SGLang's), `fcfs`, `lcas`, `mcps`
    stream_policy: str = "default"
    #: how a stream gives up KV under pressure: `auto` (cost model), `recompute`, `swap`
    preemption: str = "auto"
    #: host pool for swapped KV, in tokens (None: `default_host_kv_tokens`, as many as 4 GiB of
    #: the model's KV holds)
    host_kv_tokens: int | None = None
    #: seconds a stream may stay quiet before it is aborted (None: never)
    stream_idle_timeout: float | None = 60.0
    #: largest request body (or NDJSON line) the stream routes accept, in bytes
    max_body_bytes: int = 8 << 20
    #: on a PD prefill instance: the router that its streams' final turns go through
    pd_router: str | None = None
    #: most new tokens in one prefill turn of a context that is not final (speculative work),
    #: and in one prefill step, however many such turns wait (`sched.decide.cap_step`): a
    #: final context or a plain request waits behind at most this much of it. Default
    #: `default_speculative_chunk()`: 256 on a CPU host, 512 on a GPU; or, where this setup's
    #: saved cost profile measured the prefill step (`s2l profile`), the chunk chosen from it
    #: (`with_measured_chunk`)
    speculative_chunk: int = dataclasses.field(default_factory=default_speculative_chunk)
    #: where `speculative_chunk` came from: "default" (the device's), "given" (by the user), or
    #: "profile <path>" (measured, `with_measured_chunk`)
    speculative_chunk_source: str = "default"
    #: KV tokens that speculative work (prefill of contexts not final) leaves free for
    #: committed work (final turns, plain requests); None: the largest committed request seen
    #: waiting in the last `RESERVE_WINDOW_S` (60) seconds (its prompt and output budget, at
    #: least `speculative_chunk`), at most half the pool
    speculative_reserve: int | None = None
    #: update mode: prefill the volatile tail (what the last refinement rewrote, beyond the
    #: prefix it shares with the version before) only at the lowest priority, with budget no
    #: other request wants
    hold_back: bool = True
    #: update mode: a held-back tail is sent once the stream has been quiet for
    #: `SETTLE_GAPS` times the longest gap between its versions so far, and at most this many
    #: seconds after its last version (0: at once); a tail that a refinement arriving sooner
    #: would rewrite is then never prefilled
    hold_back_settle: float = 1.0
    #: a finish sends the final turn at once, built on the turn in flight; the scheduler keeps
    #: it until that turn has ended and hands it to the very next step (False: the manager
    #: waits for that turn's result, then sends the final turn)
    pipelined_finish: bool = True
    #: a closing stream's KV (its last finished turn's prompt and output) goes to the radix
    #: tree as cache, as a finished plain request's does (False: SGLang's own close, which
    #: frees all but the first turn's published prompt)
    publish_at_close: bool = True

    def __post_init__(self) -> None:
        from s2l_sglang.sched.policy import policy_names
        from s2l_sglang.sched.preemption import preemption_names

        if self.stream_policy not in policy_names():
            raise ValueError(
                f"stream policy {self.stream_policy!r}: choose one of {policy_names()}"
            )
        if self.preemption not in preemption_names():
            raise ValueError(f"preemption {self.preemption!r}: choose one of {preemption_names()}")
        if self.host_kv_tokens is not None and (
            not isinstance(self.host_kv_tokens, int) or self.host_kv_tokens <= 0
        ):
            raise ValueError(f"host_kv_tokens must be a positive integer: {self.host_kv_tokens!r}")
        if self.stream_idle_timeout is not None and not self.stream_idle_timeout > 0:
            raise ValueError(
                f"stream_idle_timeout must be > 0 seconds or None: {self.stream_idle_timeout!r}"
            )
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be a positive integer: {self.max_body_bytes!r}")
        if not isinstance(self.hold_back_settle, (int, float)) or not self.hold_back_settle >= 0:
            raise ValueError(f"hold_back_settle must be >= 0 seconds: {self.hold_back_settle!r}")
        if not isinstance(self.speculative_chunk, int) or self.speculative_chunk <= 0:
            raise ValueError(
                f"speculative_chunk must be a positive integer: {self.speculative_chunk!r}"
            )
        if self.speculative_reserve is not None and (
            not isinstance(self.speculative_reserve, int) or self.speculative_reserve < 0
        ):
            raise ValueError(
                f"speculative_reserve must be an integer >= 0 or None: {self.speculative_reserve!r}"
            )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> StreamConfig:
        """From `as_dict()`'s output; unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown stream settings {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)

    def replace(self, **changes: Any) -> StreamConfig:
        return dataclasses.replace(self, **changes)


# ---- command line (`s2l serve`) ---------------------------------------------------------------


def _idle_timeout(text: str) -> float | None:
    value = float(text)
    return None if value == 0 else value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`s2l serve`'s own flags (every other flag goes to SGLang)."""
    from s2l_sglang.sched.policy import policy_names
    from s2l_sglang.sched.preemption import preemption_names

    d = StreamConfig()
    group = parser.add_argument_group("stream2llm")
    group.add_argument(
        "--stream-policy",
        choices=policy_names(),
        default=d.stream_policy,
        help="order of SGLang's waiting queue for streams (default: %(default)s)",
    )
    group.add_argument(
        "--preemption",
        choices=preemption_names(),
        default=d.preemption,
        help="how streams give up KV under pressure; auto: the cheaper per victim by the "
        "measured cost model (default: %(default)s)",
    )
    group.add_argument(
        "--host-kv-tokens",
        type=int,
        default=d.host_kv_tokens,
        help="host pool for swapped KV, in tokens (default: as many as 4 GiB of the model's KV "
        "holds, vLLM's default swap space)",
    )
    group.add_argument(
        "--stream-idle-timeout",
        type=_idle_timeout,
        default=d.stream_idle_timeout,
        metavar="SECONDS",
        help="abort a stream whose client is quiet this long; 0: never (default: %(default)s)",
    )
    group.add_argument(
        "--max-stream-body-bytes",
        dest="max_body_bytes",
        type=int,
        default=d.max_body_bytes,
        help="largest body or NDJSON line of the stream routes (default: %(default)s)",
    )
    group.add_argument(
        "--stream-pd-router",
        dest="pd_router",
        default=d.pd_router,
        metavar="URL",
        help="on a PD prefill instance started by hand: the router for final turns",
    )
    group.add_argument(
        "--stream-speculative-chunk",
        dest="speculative_chunk",
        type=int,
        default=None,
        metavar="TOKENS",
        help="most new tokens in one prefill turn of a context that is not final, and in "
        "one prefill step; a final context waits behind at most this much such work "
        "(default: chosen from the prefill step measured by `s2l profile` for this setup, "
        f"else {SPECULATIVE_CHUNK_CPU} on a CPU host, {SPECULATIVE_CHUNK_GPU} on a GPU; "
        f"here {d.speculative_chunk} without a profile)",
    )
    group.add_argument(
        "--stream-speculative-reserve",
        dest="speculative_reserve",
        type=int,
        default=d.speculative_reserve,
        metavar="TOKENS",
        help="KV that prefill of contexts not final leaves free for final contexts and plain "
        "requests (default: the largest such request seen waiting in the last 60 s, at most "
        "half the KV pool)",
    )
    group.add_argument(
        "--no-stream-hold-back",
        dest="hold_back",
        action="store_false",
        default=d.hold_back,
        help="update mode: prefill a refined context's rewritten tail at speculative priority "
        "instead of the lowest (default: held back)",
    )
    group.add_argument(
        "--no-stream-pipelined-finish",
        dest="pipelined_finish",
        action="store_false",
        default=d.pipelined_finish,
        help="at a finish, wait for the stream's prefill turn in flight before sending the "
        "final turn (default: send it at once; the scheduler holds it until that turn ends)",
    )
    group.add_argument(
        "--no-stream-publish-at-close",
        dest="publish_at_close",
        action="store_false",
        default=d.publish_at_close,
        help="free a closing stream's KV as SGLang's streaming sessions do, instead of "
        "keeping it in the prefix cache for later requests with the same context "
        "(default: kept, as a finished plain request's)",
    )
    group.add_argument(
        "--stream-hold-back-settle",
        dest="hold_back_settle",
        type=float,
        default=d.hold_back_settle,
        metavar="SECONDS",
        help="update mode: a held-back tail waits until the stream has been quiet for twice "
        "the longest gap between its versions, at most this long (default: %(default)s; "
        "0: no wait)",
    )


def from_args(args: argparse.Namespace) -> StreamConfig:
    """The config of parsed `add_arguments` flags (a ValueError if a value is invalid)."""
    # every field has its flag but the chunk's source, which is set here
    names = [
        f.name for f in dataclasses.fields(StreamConfig) if f.name != "speculative_chunk_source"
    ]
    values = {name: getattr(args, name) for name in names}
    if values.get("speculative_chunk") is None:  # not given: the device default (or measured)
        values.pop("speculative_chunk", None)
    else:
        values["speculative_chunk_source"] = "given"
    return StreamConfig(**values)


def split_argv(argv: list[str]) -> tuple[StreamConfig, list[str]]:
    """`s2l serve` arguments -> (our config, the arguments for SGLang). Exits on a bad value."""
    parser = argparse.ArgumentParser(prog="s2l serve", add_help=False, allow_abbrev=False)
    add_arguments(parser)
    args, rest = parser.parse_known_args(argv)
    try:
        return from_args(args), rest
    except ValueError as exc:
        parser.error(str(exc))
        raise  # not reached


# ---- a speculative chunk measured on this hardware --------------------------------------------


def with_measured_chunk(config: StreamConfig, server_args: Any) -> StreamConfig:
    """`config` with `speculative_chunk` taken from this setup's saved cost profile (`s2l
    profile`; `CostModel.speculative_chunk`: the prefill that takes twice the smallest one's
    time, in multiples of 64 tokens and of the page, at most `chunked_prefill_size`), if the
    chunk was not given and the profile recorded its prefill step; `config` unchanged otherwise
    (the device default). One CPU default does not fit every CPU: a 256-token prefill step took
    0.14 s in bfloat16 on the AMX Xeon that 256 was measured on (the rule gives 256 there), and
    0.70-0.87 s in float32 and 3.7-4.2 s in bfloat16 on a 2-core AMD EPYC without AVX-512
    (128-192 and 64; bench/results/README.md, "speculative_chunk from a profile"). Called
    where the engine or server starts, before `attach`, so the scheduler and the stream
    manager use one value."""
    if config.speculative_chunk_source != "default":
        return config
    from s2l_sglang.sched.costmodel import find_cost_model, key_of_server_args

    if str(server_args.dtype) == "auto":  # resolved from the model in the scheduler only
        return config
    found = find_cost_model(key_of_server_args(server_args))
    if found is None:
        return config
    model, path = found
    chunk = model.speculative_chunk(server_args.page_size or 1, server_args.chunked_prefill_size)
    if chunk is None:
        return config
    return config.replace(speculative_chunk=chunk, speculative_chunk_source=f"profile {path}")


# ---- the channel to SGLang's processes ----------------------------------------------------------


def attach(server_args: Any, config: StreamConfig) -> None:
    """Store `config` on SGLang's `ServerArgs` record; it travels with it to every process."""
    import msgspec

    # A bookkeeping attribute (underscore, not a field): allowed on a sealed record, and kept
    # by `ServerArgs.__reduce__` when SGLang pickles the record into its child processes.
    msgspec.Struct.__setattr__(server_args, _ATTR, config.as_dict())


def of_server_args(server_args: Any) -> StreamConfig:
    """The config `attach` stored on `server_args`; the defaults if none was."""
    values = getattr(server_args, _ATTR, None)
    return StreamConfig() if values is None else StreamConfig.from_dict(dict(values))
