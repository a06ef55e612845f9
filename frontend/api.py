"""The public `stream_context(...)`: builds the IR node and installs the executor hooks.

Kept apart from `lang.py` (the IR nodes and executor branches) and `hooks.py` (which dispatches
to those branches), so that neither of them imports the other's importer: api -> hooks -> lang.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable

from frontend.hooks import install
from frontend.lang import MODES, SglStreamContext


def stream_context(
    source: Iterable | AsyncIterable,
    mode: str = "append",
    stream_id: str | None = None,
    keep_open: bool | None = None,
) -> SglStreamContext:
    """Stream `source`'s items into the program's context; the next `sgl.gen` finishes it.

    `stream_id` names the stream on the server (default: a fresh uuid); the gen's
    `meta_info["id"]` carries it. It must be new: a stream id is never reused.
    `keep_open=True` (an agent loop): each gen that finishes the stream keeps it open, so text
    the program adds after the gen (a tool's result) goes to the same stream and the next gen
    generates again without recomputing; the program's end aborts it. On a later
    `stream_context` of the same stream, `keep_open` changes the setting for the next gens
    (None: unchanged). Semantics in full: frontend/lang.py.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if isinstance(source, (str, bytes)) or not isinstance(source, (Iterable, AsyncIterable)):
        raise TypeError(f"source must be an iterable of chunks, not {type(source).__name__}")
    if keep_open is not None and not isinstance(keep_open, bool):
        raise TypeError(f"keep_open must be a bool or None, not {type(keep_open).__name__}")
    install()  # SGLang's executor learns the new node (once per process)
    return SglStreamContext(source, mode, stream_id, keep_open)
