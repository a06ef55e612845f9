"""Request ids of a stream's engine turns (kept import-light: the scheduler plugin reads them).

A stream's handle is its stream id; inside SGLang each turn is a request of a streaming session
named after the stream: `<stream id>::s2l<n>` for prefill turns, `<stream id>::s2l-final` for
the turn that generates.
"""

from __future__ import annotations

MARK = "::s2l"


def turn_rid(stream_id: str, n: int) -> str:
    return f"{stream_id}{MARK}{n}"


def final_rid(stream_id: str) -> str:
    return f"{stream_id}{MARK}-final"


def stream_of(rid: str | None) -> str | None:
    """The stream id a turn's rid belongs to, or None for any other request."""
    if not rid or MARK not in rid:
        return None
    return rid.rpartition(MARK)[0]
