"""A stream's final turn on a PD prefill instance, sent through the router (docs/pd.md).

On a prefill instance of a prefill-decode deployment, a stream's prefill-only turns run locally
(no KV hand-off), and its final turn is an ordinary PD request: the manager posts the stream's
whole prompt (`input_ids`, rid `<sid>::s2l-final`) to the router's `/generate`; the router adds
the bootstrap fields and sends it to a prefill instance and a decode instance at once. On this
prefill instance the plugin's `TokenizerManager.generate_request` hook finds the rid here
(`RouterFinal.claim`) and turns the router's copy back into the stream's session turn (the delta
tokens, the rollback offset): the held KV is reused, the rest is prefilled and the whole prompt's
KV goes to the decode instance, whose tokens come back through the router to the manager.

A router that picks another prefill instance sends it a plain request for the whole prompt: the
output is the same, only the stream's prefill work is not reused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from s2l_sglang.rid import stream_of
from s2l_sglang.server.headers import ROUTING_KEY_HEADER
from s2l_sglang.stream.errors import StreamError
from s2l_sglang.stream.isolation import stream_id_of


@dataclass
class PendingFinal:
    """A final turn posted to the router, waiting for its copy to reach this prefill instance."""

    input_ids: list[int]  # the session turn's delta
    session_params: dict[str, Any]
    claimed: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    prefill_meta: dict = field(default_factory=dict)  # the prefill side's last meta_info


class RouterFinal:
    """Runs final turns through a PD router; the plugin's hook claims them on arrival."""

    def __init__(self, router_url: str | None, timeout_s: float = 3600.0):
        self.router_url = (router_url or "").rstrip("/")
        self.timeout_s = timeout_s
        self.pending: dict[str, PendingFinal] = {}

    async def outputs(self, obj: Any, prompt: list[int]) -> AsyncIterator[dict]:
        """Post the turn `obj` (a session turn) as a PD request for `prompt`; yield its outputs.

        The last output's `cached_tokens` is the prefill instance's (held and cached KV it
        reused), as for a stream's final turn on a single instance, and its `pd_claimed` says
        whether the turn ran here as the stream's session turn.
        """
        import aiohttp

        if not self.router_url:
            raise StreamError(
                "this PD prefill instance has no router for final turns "
                "(s2l serve --stream-pd-router URL, or s2l serve --pd)",
                stream_of(obj.rid),
            )
        pending = PendingFinal(list(obj.input_ids), dict(obj.session_params))
        self.pending[obj.rid] = pending
        body = {
            "input_ids": prompt,
            "sampling_params": obj.sampling_params,
            "rid": obj.rid,
            "stream": True,
        }
        sid = stream_of(obj.rid)
        last: dict | None = None
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                # the stream id as routing key: the router's manual prefill policy sends the
                # prefill copy to the instance that holds the stream's commands (this one)
                headers = {ROUTING_KEY_HEADER: stream_id_of(sid or "")}
                post = session.post(f"{self.router_url}/generate", json=body, headers=headers)
                async with post as resp:
                    if resp.status != 200:
                        text = (await resp.text())[:500]
                        raise StreamError(f"PD router answered {resp.status}: {text}", sid)
                    async for line in resp.content:
                        if not line.startswith(b"data: "):
                            continue
                        payload = line[len(b"data: ") :].strip()
                        if payload == b"[DONE]":
                            break
                        out = orjson.loads(payload)
                        if "error" in out:
                            raise StreamError(f"PD request failed: {out['error']}", sid)
                        if last is not None:
                            yield last
                        last = out
            if last is None:
                raise StreamError("PD router returned no output", sid)
            last = dict(last)
            meta = dict(last.get("meta_info", {}))
            # whether the router's copy reached this instance and ran as the session turn
            # (False: another prefill instance served it as a plain request)
            meta["pd_claimed"] = pending.claimed
            if pending.claimed:  # the prefill side ends (done, failed or aborted) on its own
                await pending.done.wait()
                if "cached_tokens" in pending.prefill_meta:
                    meta["cached_tokens"] = pending.prefill_meta["cached_tokens"]
            last["meta_info"] = meta
            yield last
        except aiohttp.ClientError as exc:
            raise StreamError(f"PD router unreachable: {exc}", sid) from exc
        finally:
            self.pending.pop(obj.rid, None)

    def claim(self, obj: Any) -> PendingFinal | None:
        """On the router's copy of a final turn: make it the session turn (None if not ours)."""
        pending = self.pending.get(obj.rid) if isinstance(obj.rid, str) else None
        if pending is None or pending.claimed:
            return None
        pending.claimed = True
        obj.input_ids = pending.input_ids
        obj.text = None
        obj.session_params = pending.session_params
        return pending

    @staticmethod
    async def watch(pending: PendingFinal, outputs: AsyncIterator[dict]) -> AsyncIterator[dict]:
        """Pass the prefill side's outputs on, keeping its last meta_info for the manager."""
        try:
            async for out in outputs:
                pending.prefill_meta = out.get("meta_info", {})
                yield out
        finally:
            pending.done.set()


_active: RouterFinal | None = None


def activate(router_url: str | None) -> RouterFinal:
    """This process's `RouterFinal` (one per prefill instance's HTTP server)."""
    global _active
    _active = RouterFinal(router_url)
    return _active


def active() -> RouterFinal | None:
    return _active
