"""Benchmark queries: traces cut to a token budget, their timeline scaled, the prompt split.

A `Query` is what every mode replays: the template's head (the instruction up to the context),
the context chunks with their arrival times, and the tail (the question), which is sent with the
final chunk. `prompt(i)` is the prompt as known after chunk i, without the question
(what prefix warming resends); `final_prompt` is the full prompt, equal to
`trace.prompt(final context)` (the context first, the question last).

Token budget (`--max-context-tokens`, counted with the model's tokenizer on the context alone):
- append: chunks are kept while they fit; the chunk that crosses the budget is cut to the
  tokens left, and later chunks are dropped: the retrieval "ends" there, so the query's final
  chunk arrives earlier than in the full trace;
- update: every refined context is cut to its first `budget` tokens (the number of updates and
  their times are kept).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bench.tracefiles import read_any
from bench.traces import Mode, Trace

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]
_PLACEHOLDER = re.compile(r"\{(question)\}")


@dataclass(frozen=True)
class Chunk:
    """One context event: at `t` seconds after the query's start; append text or whole context."""

    t: float
    text: str


@dataclass(frozen=True)
class Query:
    id: str
    workload: str
    mode: Mode
    head: str  # the template before the context (the instruction)
    tail: str  # the template after the context (the question): sent with the final chunk
    chunks: tuple[Chunk, ...]

    def context(self, i: int) -> str:
        """The context after chunks 0..i."""
        if self.mode == "update":
            return self.chunks[i].text
        return "".join(c.text for c in self.chunks[: i + 1])

    def prompt(self, i: int) -> str:
        """The prompt known after chunk i, without the question (not yet sent)."""
        return self.head + self.context(i)

    @property
    def final_prompt(self) -> str:
        return self.prompt(len(self.chunks) - 1) + self.tail

    @property
    def final_t(self) -> float:
        """When the final chunk (and the question) arrives, seconds after the query's start."""
        return self.chunks[-1].t

    @property
    def cached_prefix(self) -> str | None:
        """The lower bound's cached text: the prompt before the final chunk (None: one chunk)."""
        return self.prompt(len(self.chunks) - 2) if len(self.chunks) > 1 else None


def split_template(template: str, question: str) -> tuple[str, str]:
    """(head, tail) around `{context}`, with the question filled in."""
    head, sep, tail = template.partition("{context}")
    if not sep:
        raise ValueError("template has no {context}")
    fill = lambda s: _PLACEHOLDER.sub(lambda m: question, s)  # noqa: E731
    return fill(head), fill(tail)


def truncate_append(texts: Sequence[str], budget: int, encode: Encode, decode: Decode) -> list[str]:
    """The leading append chunks within `budget` tokens, the one that crosses it cut to fit."""
    kept: list[str] = []
    used = 0
    for text in texts:
        ids = encode(text)
        if used + len(ids) <= budget:
            kept.append(text)
            used += len(ids)
            if used == budget:
                break
            continue
        cut = decode(ids[: budget - used])
        if cut:
            kept.append(cut)
        break
    return kept


def truncate_update(texts: Sequence[str], budget: int, encode: Encode, decode: Decode) -> list[str]:
    """Every refined context cut to its first `budget` tokens."""
    out = []
    for text in texts:
        ids = encode(text)
        out.append(text if len(ids) <= budget else decode(ids[:budget]))
    return out


def build_query(
    trace: Trace,
    budget: int | None = None,
    encode: Encode | None = None,
    decode: Decode | None = None,
    delay_scale: float = 1.0,
) -> Query:
    """A `Query` from `trace`: cut to `budget` context tokens (None: whole), times x `delay_scale`."""
    texts = [e.content for e in trace.events]
    if budget is not None:
        if encode is None or decode is None:
            raise ValueError("a token budget needs encode and decode")
        cut = truncate_append if trace.mode == "append" else truncate_update
        texts = cut(texts, budget, encode, decode)
        if not texts:
            raise ValueError(f"trace {trace.id}: nothing left within {budget} tokens")
    chunks = tuple(
        Chunk(e.t * delay_scale, text) for e, text in zip(trace.events, texts, strict=False)
    )
    head, tail = split_template(trace.template, trace.question)
    return Query(trace.id, trace.workload, trace.mode, head, tail, chunks)


def scaled(query: Query, factor: float) -> Query:
    """The same query with every chunk time multiplied by `factor` (a stretched timeline)."""
    return replace(query, chunks=tuple(Chunk(c.t * factor, c.text) for c in query.chunks))


def select(traces: Sequence[Trace], n: int | None, seed: int) -> list[Trace]:
    """`n` traces drawn without replacement (seeded), in file order; all of them if n is None."""
    if n is None or n >= len(traces):
        return list(traces)
    picked = np.random.default_rng(seed).choice(len(traces), size=n, replace=False)
    return [traces[i] for i in sorted(picked)]


def load_queries(
    path: str | Path,
    n: int | None,
    seed: int,
    budget: int | None,
    encode: Encode,
    decode: Decode,
    delay_scale: float = 1.0,
) -> list[Query]:
    """Read a trace file (any format `bench.tracefiles` reads), select `n` traces and build
    their queries."""
    traces = select(read_any(path), n, seed)
    return [build_query(t, budget, encode, decode, delay_scale) for t in traces]
