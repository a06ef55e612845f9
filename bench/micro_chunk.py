"""Per-chunk cost: append 16-token chunks to one context until the model's context is full, and
time each append's acknowledgement against the context length, three ways.

    .venv/bin/python -m bench.micro_chunk [--max-tokens 8128] [--every 1] [--chunk-tokens 16]
        [--dtype bfloat16] [--out bench/results/micro_chunk]

- `stream` (ours): `append()` on the stream manager; acknowledged when the engine holds the
  new text (`await wait_prefilled(sid)`: the stream's prefill turns have ended). `call_s` is
  the time of the `append()` call itself: the manager's own cost (it re-tokenizes only the
  context's last tokens, `stream/tokens.py`).
  An earlier version polled `status()` every 0.5 ms on the engine's event loop instead; on 2
  cores that polling took CPU from SGLang's scheduler and made our acks look 3-4x slower than
  they are (see bench/results/README.md).
- `sessions`: SGLang's streaming session (open_session(streaming=True)), one max_new_tokens=0
  turn per chunk with the chunk's token ids; acknowledged when the turn returns.
- `warming`: prefix warming, the whole text so far as token ids with max_new_tokens=0 (the
  radix cache holds the previous prefix); acknowledged when the request returns.

At each measured point the methods run in a seeded random order (machine drift hits all alike),
each on its own text (no method reuses another's KV). `--every K` measures every K-th chunk:
the K-1 chunks between are sent in one untimed step. Writes micro_chunk.json and
micro_chunk.png under --out and prints one summary line.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.presets import REPO_ROOT, WORKLOAD_FILES

METHODS = ("stream", "sessions", "warming")
PREFILL_ONLY = {"max_new_tokens": 0}
OUT = REPO_ROOT / "bench" / "results" / "micro_chunk"


def chunk_points(max_tokens: int, chunk: int = 16, every: int = 1) -> list[int]:
    """Context lengths (tokens) after each measured append: every `every`-th chunk of `chunk`
    tokens, up to `max_tokens`."""
    if chunk <= 0 or every <= 0:
        raise ValueError("chunk and every must be > 0")
    step = chunk * every
    return list(range(step, max_tokens + 1, step))


def at_lengths(points: Sequence[dict], lengths: Sequence[int], key: str = "ack_s") -> dict:
    """The median `key` of the points within 10% of each length (None where there are none)."""
    out = {}
    for n in lengths:
        near = [p[key] for p in points if p.get(key) is not None
                and abs(p["context_tokens"] - n) <= 0.1 * n]  # fmt: skip
        out[str(n)] = float(np.median(near)) if near else None
    return out


def source_ids(tokenizer: Any, need: int) -> list[int]:
    """At least `need` token ids of real text (the crawler traces' contexts)."""
    from bench.traces import read_traces

    ids: list[int] = []
    for trace in read_traces(REPO_ROOT / WORKLOAD_FILES["crawler"]):
        ids += tokenizer.encode(trace.final_context, add_special_tokens=False)
        if len(ids) >= need:
            return ids[:need]
    raise ValueError(f"the crawler traces hold fewer than {need} tokens")


class Method:
    """One way of growing a context; `grow(ids)` sends ids untimed, `step(ids)` times them."""

    def __init__(self, backend: Any, name: str, ids: list[int], tokenizer: Any):
        self.backend, self.name, self.ids, self.tok = backend, name, ids, tokenizer
        self.sent = 0  # tokens of `ids` sent so far
        self.text = ""
        self.sid = f"micro-{name}-{time.monotonic_ns()}"

    async def open(self) -> None:
        if self.name == "stream":
            await self.backend.streams.open(self.sid, {"max_new_tokens": 1})
        elif self.name == "sessions":
            await self.backend.open_session(self.sid)

    async def send(self, upto: int) -> tuple[float, float | None, int]:
        """Send ids[sent:upto]; (ack seconds, append() call seconds, context tokens)."""
        new = self.ids[self.sent : upto]
        self.sent = upto
        t0 = time.perf_counter()
        if self.name == "stream":
            streams = self.backend.streams
            piece = self.tok.decode(new)
            await streams.append(self.sid, piece)
            call = time.perf_counter() - t0
            status = await streams.wait_prefilled(self.sid)
            return time.perf_counter() - t0, call, status["context_tokens"]
        rid = f"{self.sid}-{upto}"
        if self.name == "sessions":
            outputs = self.backend.generate(new, PREFILL_ONLY, rid, self.sid)
        else:
            outputs = self.backend.generate(self.ids[:upto], PREFILL_ONLY, rid)
        async for _ in outputs:
            pass
        return time.perf_counter() - t0, None, upto

    async def close(self) -> None:
        if self.name == "stream":
            await self.backend.stream_abort(self.sid)
        elif self.name == "sessions":
            await self.backend.close_session(self.sid)


def measure(engine: Any, max_tokens: int, chunk: int, every: int, methods: Sequence[str],
            seed: int = 0, progress: bool = True) -> dict[str, list[dict]]:  # fmt: skip
    """The curve of every method on `engine` (a started `StreamEngine`)."""
    from tqdm import tqdm

    from bench.harness.backends import EngineBackend

    backend = EngineBackend(engine)
    ids = source_ids(engine.tokenizer, max_tokens * len(methods))
    runners = [
        Method(backend, m, ids[i * max_tokens : (i + 1) * max_tokens], engine.tokenizer)
        for i, m in enumerate(methods)
    ]
    curves: dict[str, list[dict]] = {m: [] for m in methods}
    rng = np.random.default_rng(seed)
    for r in runners:
        engine._call(r.open())
    try:
        for n in tqdm(chunk_points(max_tokens, chunk, every), disable=not progress, unit="point"):
            for i in rng.permutation(len(runners)):
                r = runners[int(i)]
                if n - chunk > r.sent:
                    engine._call(r.send(n - chunk))  # the untimed chunks between points
                ack, call, context = engine._call(r.send(n))
                curves[r.name].append({"context_tokens": context, "ack_s": ack, "call_s": call})
    finally:
        for r in runners:
            engine._call(r.close())
    return curves


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, help="context to grow to (default: full)")
    parser.add_argument("--every", type=int, default=1, help="measure every K-th chunk")
    parser.add_argument("--chunk-tokens", type=int, default=16)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS):
        parser.error(f"--methods: choose from {METHODS}")

    import orjson

    from bench.harness.machine import machine_info
    from bench.harness.plots import plot_chunk_cost
    from s2l_sglang.stream.engine import StreamEngine

    started = time.perf_counter()
    machine = machine_info()
    engine = StreamEngine(idle_timeout=None, log_level="error", dtype=args.dtype,
                          chunked_prefill_size=512, max_total_tokens=32768)  # fmt: skip
    try:
        engine.generate("warm up", {"max_new_tokens": 1})
        limit = engine.streams.context_len - 64  # room for the stream's final turn
        max_tokens = min(args.max_tokens or limit, limit)
        curves = measure(engine, max_tokens, args.chunk_tokens, args.every, methods, args.seed,
                         not args.quiet)  # fmt: skip
    finally:
        engine.shutdown()
    lengths = [n for n in (1000, 2000, 4000, 8000) if n <= max_tokens * 1.05]
    data = {
        "command": "python -m bench.micro_chunk " + " ".join(argv or []),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine,
        "model": "SmolLM2-135M-Instruct (embedded)",
        "dtype": args.dtype,
        "chunk_tokens": args.chunk_tokens,
        "every": args.every,
        "max_tokens": max_tokens,
        "wall_s": time.perf_counter() - started,
        "summary": {m: at_lengths(c, lengths) for m, c in curves.items()},
        "append_call_s": at_lengths(curves.get("stream", []), lengths, "call_s"),
        "methods": curves,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "micro_chunk.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    plot_chunk_cost(data, args.out / "micro_chunk.png")
    print(summary_line(data, args.out))
    return 0


def summary_line(data: dict, out: Path) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f}"

    parts = [
        f"{m} " + "/".join(ms(v) for v in by_len.values()) for m, by_len in data["summary"].items()
    ]
    lengths = "/".join(data["summary"][next(iter(data["summary"]))].keys())
    calls = "/".join(ms(v) for v in data["append_call_s"].values())
    return (
        f"micro_chunk: ack of a {data['chunk_tokens']}-token append at {lengths} tokens (ms): "
        + ", ".join(parts)
        + f"; stream append() call {calls} ms; {data['wall_s']:.0f} s; results in {out}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
