"""The replay driver: one mode, one workload, one rate; and the per-query TTFT lower bound.

Runs on the backend's loop (the engine's own loop in process). Each query is a task that starts
at its Poisson offset and sends its chunks at `start + chunk.t` through the mode; a query not
done `drain_timeout` seconds after the last final chunk is cancelled (its requests aborted,
its session or stream closed) and recorded as failed ("timed out"), which keeps a run that
stalls (e.g. SGLang sessions pinning all KV) from hanging the benchmark.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from bench.harness.backends import Backend
from bench.harness.modes import Mode, generate, prefill
from bench.harness.queries import Query
from bench.harness.record import QueryRecord, Timeline

LEAD_S = 0.05  # the first query starts this long after the tasks are created


async def replay(
    backend: Backend,
    mode: Mode,
    queries: Sequence[Query],
    offsets: Sequence[float],
    rate: float,
    params: dict,
    drain_timeout: float,
    on_done: Callable[[QueryRecord], None] | None = None,
) -> list[QueryRecord]:
    """Replay `queries` (starting at `offsets`) through `mode`; one record per query, in order."""
    tl = Timeline(time.perf_counter() + LEAD_S)
    records = [
        QueryRecord(
            query=q.id,
            workload=q.workload,
            trace_mode=q.mode,
            mode=mode.label,
            rate=rate,
            start=float(s),
            final_at=float(s) + q.final_t,
        )
        for q, s in zip(queries, offsets, strict=True)
    ]

    async def one(query: Query, rec: QueryRecord) -> None:
        try:
            await mode.run(backend, query, rec, tl, params)
        except asyncio.CancelledError:
            rec.error = rec.error or f"timed out ({drain_timeout:g} s after the last final chunk)"
        except Exception as exc:  # one query's failure is a result, not a crash
            rec.error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            if on_done is not None:
                on_done(rec)

    tasks = [asyncio.ensure_future(one(q, r)) for q, r in zip(queries, records, strict=True)]
    horizon = max((r.final_at for r in records), default=0.0) + drain_timeout
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, horizon - tl.now()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return records


async def lower_bound(backend: Backend, query: Query, params: dict, label: str = "bound") -> float:
    """Measured TTFT with everything before the final chunk already cached (an idle engine).

    The prompt before the final chunk is prefilled first (max_new_tokens=0, kept by the radix
    cache), then the full prompt is sent and timed from the send to its first token. Returns
    inf if the request failed.
    """
    rec = QueryRecord(query.id, query.workload, query.mode, label, 0.0, 0.0, 0.0)
    rid = Mode.new_id(query, label)
    prefix = query.cached_prefix
    if prefix is not None:
        await prefill(backend, backend.encode(prefix), rid + "-prefix", rec)
    ids = backend.encode(query.final_prompt)
    tl = Timeline()
    await generate(backend, ids, params, rid, rec, tl)
    return rec.ttft


async def speed_probe(backend: Backend, tokens: int) -> float:
    """Seconds the idle engine takes to prefill `tokens` tokens of fixed text and give one token,
    from a flushed cache: how fast the machine is at this moment (other jobs may share it).

    The cache is flushed before and by the caller after, so the probe leaves nothing behind.
    """
    ids = backend.encode(" ".join(f"probe{i}" for i in range(tokens)))[:tokens]
    await backend.flush()
    rec = QueryRecord("probe", "probe", "append", "probe", 0.0, 0.0, 0.0)
    await generate(
        backend, ids, {"max_new_tokens": 1}, f"probe-{time.monotonic_ns()}", rec, Timeline()
    )
    return rec.ttft
