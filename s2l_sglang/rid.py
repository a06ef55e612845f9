"""Request ids of a stream's engine turns (kept import-light: the scheduler plugin reads them).

A stream's handle is its stream id; inside SGLang each turn is a request of the stream's
streaming session, named by the session's key (stream/isolation.py): `<key>::s2l<n>` for prefill
turns, `<key>::s2lv<n>` for prefill turns of a volatile tail (the part of an update-mode context
that the last refinement rewrote: the lowest priority), `<key>::s2l-final` for the turn that
generates (`-final1`, `-final2`, ... for the next ones of a stream kept open).
"""

from __future__ import annotations

MARK = "::s2l"

#: the abort message of a stale speculative turn the scheduler cancelled (messages.py)
CANCELLED = "s2l: stale speculative turn cancelled"
#: the abort message of a final turn sent while the stream's turn before it was in flight, when
#: that turn did not end as the one it was built on (cancelled): the manager sends it again
REBASE = "s2l: final turn built on a turn that did not finish"


def turn_rid(stream_id: str, n: int) -> str:
    return f"{stream_id}{MARK}{n}"


def volatile_rid(stream_id: str, n: int) -> str:
    """The rid of a prefill turn of a volatile tail (ordered after all other work)."""
    return f"{stream_id}{MARK}v{n}"


def is_volatile(rid: str | None) -> bool:
    """True for a prefill turn of a volatile tail (`volatile_rid`)."""
    return bool(rid) and parts(rid)[1]


def final_rid(stream_id: str, n: int = 0) -> str:
    """The rid of a stream's `n`-th generating turn (n > 0 after a finish that kept it open)."""
    return f"{stream_id}{MARK}-final{n or ''}"


def is_final(rid: str | None) -> bool:
    """True for a generating turn of a stream (`final_rid`)."""
    if not rid or MARK not in rid:
        return False
    return _final_tail(rid.rpartition(MARK)[2])


def _final_tail(tail: str) -> bool:
    return tail.startswith("-final") and (tail == "-final" or tail[6:].isdigit())


def is_speculative(rid: str | None) -> bool:
    """True for a prefill turn of a stream (its context not final yet): speculative work."""
    return bool(rid) and parts(rid)[2]


def parts(rid: str) -> tuple[str, bool, bool]:
    """`stream_of(rid)` ("" for any other request), `is_volatile(rid)` and
    `is_speculative(rid)`, in one split."""
    sid, mark, tail = rid.rpartition(MARK)
    if not mark:
        return "", False, False
    return sid, tail[:1] == "v", not _final_tail(tail)


def stream_of(rid: str | None) -> str | None:
    """The stream id a turn's rid belongs to, or None for any other request."""
    if not rid or MARK not in rid:
        return None
    return rid.rpartition(MARK)[0]
