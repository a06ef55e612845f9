"""The normalized streaming trace: one query, its prompt template, and its timed context events.

A trace file is JSON lines, one `Trace` per line (`read_traces` / `write_traces`); a `.xz` or
`.gz` suffix compresses it (update-mode traces repeat the whole context in every event, which
xz shrinks about 13 times).

Timeline: `TraceEvent.t` is seconds since the query's start on the *modelled* timeline that a
benchmark replays; `TraceEvent.t_measured` is the real time measured on the collecting machine
(None when unknown, e.g. traces read from the Stream2LLM artifact). The two are kept apart
because our retrieval runs on loopback / a small in-memory index, far faster than the paper's
web crawl and disk-based ANN search; the modelled time is calibrated to the paper's statistics
(see `bench.workloads.latency`).

Modes:
- append: each event's `content` is text added at the end of the context; the context after
  event i is the concatenation of contents 0..i.
- update: each event's `content` is the whole refined context, replacing the previous one.

The last event marks the context as final (the retrieval has finished).

Prompt layout: the template puts the context first and the question at the end
(`...Context:\\n{context}\\n\\nQuestion: {question}`), as the artifact does. Appended context thus
keeps a growing common prefix with what was already prefilled; the question is known from the
start but belongs to the tail, which the paper sends with the last chunk. A harness that
tokenizes `trace.prompt(context_so_far)` for a partial context must treat the question suffix
as not yet sent (or recompute it), since the next chunk lands before it.
"""

from __future__ import annotations

import gzip
import lzma
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import IO, Any, Literal

import orjson

Mode = Literal["append", "update"]
MODES: tuple[Mode, ...] = ("append", "update")

# The paper's fixed RAG template (artifact: template + "\n" + docs + end_template + " " + query).
DEFAULT_TEMPLATE = (
    "Answer the question based only on the provided context. "
    'If the answer is not in the context, say "I don\'t know."\n'
    "Context:\n{context}\n\nQuestion: {question}"
)
_PLACEHOLDER = re.compile(r"\{(context|question)\}")


class TraceFileError(ValueError):
    """A trace file that cannot be read: names the file and, where known, the line."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        self.path, self.line, self.message = str(path), line, message
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}")


@dataclass(frozen=True)
class TraceEvent:
    """One context chunk: at `t` seconds (modelled), `content` arrives in `mode`."""

    t: float
    mode: Mode
    content: str
    t_measured: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"event mode must be one of {MODES}, got {self.mode!r}")
        if self.t < 0:
            raise ValueError(f"event time must be >= 0, got {self.t}")


@dataclass(frozen=True)
class Trace:
    """One query's stream. Events are ordered by `t` (non-decreasing) and share the trace's mode."""

    id: str
    workload: str
    mode: Mode
    question: str
    template: str
    events: tuple[TraceEvent, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.events:
            raise ValueError(f"trace {self.id}: no events")
        if "{context}" not in self.template or "{question}" not in self.template:
            raise ValueError(f"trace {self.id}: template needs {{context}} and {{question}}")
        times = [e.t for e in self.events]
        if any(b < a for a, b in pairwise(times)):
            raise ValueError(f"trace {self.id}: event times are not ordered")
        if any(e.mode != self.mode for e in self.events):
            raise ValueError(f"trace {self.id}: event modes differ from the trace mode")

    def prompt(self, context: str) -> str:
        """The full prompt for `context` (context first, question last)."""
        values = {"context": context, "question": self.question}
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.template)

    def context_after(self, index: int) -> str:
        """The context once events 0..index have arrived."""
        if self.mode == "update":
            return self.events[index].content
        return "".join(e.content for e in self.events[: index + 1])

    def contexts(self) -> Iterator[str]:
        """The context after each event, in order."""
        text = ""
        for event in self.events:
            text = event.content if self.mode == "update" else text + event.content
            yield text

    @property
    def final_context(self) -> str:
        return self.context_after(len(self.events) - 1)

    @property
    def duration(self) -> float:
        """Modelled time of the last (finalizing) event."""
        return self.events[-1].t

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "workload": self.workload,
            "mode": self.mode,
            "question": self.question,
            "template": self.template,
            "events": [
                {"t": e.t, "mode": e.mode, "content": e.content, "t_measured": e.t_measured}
                for e in self.events
            ],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trace:
        events = tuple(
            TraceEvent(
                t=float(e["t"]),
                mode=e["mode"],
                content=e["content"],
                t_measured=None if e.get("t_measured") is None else float(e["t_measured"]),
            )
            for e in d["events"]
        )
        return cls(
            id=str(d["id"]),
            workload=d["workload"],
            mode=d["mode"],
            question=d["question"],
            template=d["template"],
            events=events,
            meta=dict(d.get("meta") or {}),
        )


def _open(path: Path, mode: str) -> IO[bytes]:
    if path.suffix == ".xz":
        return lzma.open(path, mode)
    if path.suffix == ".gz":
        return gzip.GzipFile(path, mode, mtime=0)  # no timestamp: same traces, same bytes
    return path.open(mode)


def write_traces(path: str | Path, traces: Iterable[Trace]) -> int:
    """Write traces as JSON lines (compressed for .xz / .gz); returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with _open(path, "wb") as f:
        for trace in traces:
            f.write(orjson.dumps(trace.to_dict()))
            f.write(b"\n")
            n += 1
    return n


def read_traces(path: str | Path) -> list[Trace]:
    """Read a JSON-lines trace file, plain or .xz / .gz (blank lines are skipped).

    A malformed line, or a trace id seen before, raises `TraceFileError` naming the file and
    the line."""
    path = Path(path)
    traces, seen = [], set()
    try:
        with _open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    trace = _parse_line(path, lineno, line)
                    if trace.id in seen:
                        raise TraceFileError(path, lineno, f"duplicate trace id {trace.id!r}")
                    seen.add(trace.id)
                    traces.append(trace)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise TraceFileError(path, None, f"cannot read: {exc}") from None
    return traces


_FIELDS = {"id": (str, int), "workload": str, "mode": str, "question": str, "template": str}
_EVENT_FIELDS = {"t": (int, float), "mode": str, "content": str}


def _parse_line(path: Path, lineno: int, line: bytes) -> Trace:
    def fail(message: str) -> TraceFileError:
        return TraceFileError(path, lineno, message)

    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise fail(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise fail("expected a JSON object (one trace per line)")
    for name, kind in _FIELDS.items():
        if name not in obj:
            raise fail(f"missing field {name!r}")
        if not isinstance(obj[name], kind):
            raise fail(f"field {name!r} has the wrong type ({type(obj[name]).__name__})")
    events = obj.get("events")
    if not isinstance(events, list):
        raise fail("field 'events' must be a list")
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise fail(f"event {i} is not an object")
        for name, kind in _EVENT_FIELDS.items():
            if not isinstance(event.get(name), kind) or isinstance(event.get(name), bool):
                raise fail(f"event {i}: field {name!r} missing or of the wrong type")
    try:
        return Trace.from_dict(obj)
    except (ValueError, TypeError) as exc:
        raise fail(str(exc)) from None
