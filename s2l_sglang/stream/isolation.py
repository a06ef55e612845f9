"""Isolation: a stream's SGLang session is reached only by that stream's own turns.

A stream is an SGLang streaming session, and SGLang lets any request name a session
(`/generate` with `session_params.id`, `/close_session`). So a stream's session is not named
after the stream's id: it gets an internal *session key*, the stream id plus 64 random bits
(`new_key`), which no response carries (outputs are relabelled with the stream id). On top of
that, two guards run in the tokenizer manager's process (plugin hooks):

- `check_generate`: a request that names a live stream's session key is refused (a 400 from
  SGLang's own error path) unless it is one of the manager's turns in flight (`own_rids`). A
  PD router's copy of a final turn names no session (pd/hooks.py gives it one after this
  check, from the turn the manager posted);
- `check_close`: `/close_session` of a live stream's key is refused unless the manager closes
  it.

The HTTP stream routes add a per-stream token (`new_token`, returned by open): every later
call on the stream carries it in the `X-Stream-Token` header (routes.py), beside the
server's `--api-key`. The registry below is per process; the in-process `StreamEngine` API is
the caller's own and takes no token.
"""

from __future__ import annotations

import hmac
import secrets

TOKEN_HEADER = "X-Stream-Token"

#: session keys of the live streams of this process
live_keys: set[str] = set()
#: rids of the manager's own turns, while they are sent
own_rids: set[str] = set()
#: session keys the manager is closing
closing: set[str] = set()


def new_key(sid: str) -> str:
    """An internal session key for stream `sid`: not guessable, not the stream's id."""
    return f"{sid}.{secrets.token_hex(8)}"


def stream_id_of(key: str) -> str:
    """The stream id of a session key (`new_key`)."""
    return key.rpartition(".")[0]


def new_token() -> str:
    return secrets.token_urlsafe(24)


def token_matches(expected: str, given: str | None) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def check_generate(obj: object) -> None:
    """Refuse a request that would write into a live stream's session unless it is the
    manager's own turn. Raises ValueError (SGLang's 400)."""
    rid = getattr(obj, "rid", None)
    rids = rid if isinstance(rid, list) else [rid]
    if all(isinstance(r, str) and r in own_rids for r in rids):
        return
    params = getattr(obj, "session_params", None)
    session = params.get("id") if isinstance(params, dict) else None
    if isinstance(params, list):  # a batch: one entry per request
        session = next((p.get("id") for p in params if isinstance(p, dict) and p.get("id")), None)
    if isinstance(session, str) and session in live_keys:
        raise ValueError("session is held by a stream: use the /stream routes")


def check_close(obj: object) -> None:
    """Refuse closing a live stream's session from anywhere but the stream manager."""
    session = getattr(obj, "session_id", None)
    if isinstance(session, str) and session in live_keys and session not in closing:
        raise ValueError("session is held by a stream: abort it with POST /stream/abort")
