"""Stream commands through a PD router: the decode instance relays them to their prefill instance.

A stream command (server/routed.py) sent to sglang-router in PD mode reaches two instances at
once: the router adds `bootstrap_host`, `bootstrap_port` and `bootstrap_room` to the `/generate`
body and posts it to the prefill instance its prefill policy picked (`manual`: the one that holds
the routing key, the stream id) and to a decode instance, waits for both, and answers with the
decode instance's response (docs/pd.md). So:

- the prefill instance answers its copy at once with a no-op (`PREFILL_COPY_ANSWER`): the router
  must not wait on it, and the command must not run twice;
- the decode instance finds the prefill instance of the bootstrap port in the router's own list
  of workers (`GET /workers`, which names each prefill worker's URL and bootstrap port) and
  relays the command there as a direct `/generate` command (no bootstrap fields: the prefill
  instance runs it); its answer, status and body (events streamed as they come) is the decode
  instance's answer, which the router passes to the client.

A final turn then leaves the prefill instance as an ordinary PD request through the router, with
the stream id as routing key (pd/final.py): the manual policy sends its prefill copy back to the
instance that holds the stream, where it runs as the stream's session turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import orjson
from fastapi.responses import Response, StreamingResponse

from s2l_sglang.stream.errors import StreamError

#: the prefill instance's answer to its copy of a command that came through the PD router
PREFILL_COPY_ANSWER = {"s2l": "relayed: the decode instance's copy runs the command"}
#: the fields the PD router adds to a /generate body
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
#: request headers a relay carries on to the prefill instance
RELAYED_HEADERS = ("authorization", "x-smg-routing-key")


class PrefillUnknown(StreamError):
    """No prefill instance of the router's list has the command's bootstrap port."""

    status, code = 502, "prefill_unknown"


class BadBootstrap(StreamError):
    """A command with the PD router's fields, but not as the router writes them."""

    status, code = 400, "bad_request"


class NoRouter(StreamError):
    """A decode instance got a stream command but knows no router to find its prefill in."""

    status, code = 400, "no_pd_router"


def via_pd_router(body: dict) -> bool:
    """Whether a `/generate` command body is a PD router's copy (it added the bootstrap fields)."""
    return body.get("bootstrap_port") is not None and body.get("bootstrap_room") is not None


def _bootstrap_port(entry: Any) -> int | None:
    """The `bootstrap_port` anywhere in one entry of the router's worker list."""
    if isinstance(entry, dict):
        port = entry.get("bootstrap_port")
        if isinstance(port, int):
            return port
        for value in entry.values():
            found = _bootstrap_port(value)
            if found is not None:
                return found
    elif isinstance(entry, list):
        for value in entry:
            found = _bootstrap_port(value)
            if found is not None:
                return found
    return None


def prefill_urls(workers: Any) -> dict[tuple[str, int], str]:
    """(bootstrap host, bootstrap port) -> HTTP URL of each prefill worker in the router's
    `GET /workers` answer (a list, or an object with a "workers" list); the host is the URL's,
    as the router takes it for `bootstrap_host`."""
    entries = workers.get("workers", []) if isinstance(workers, dict) else workers
    found: dict[tuple[str, int], str] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            continue
        port = _bootstrap_port(entry)
        if port is not None:
            found[(urlsplit(entry["url"]).hostname or "", port)] = entry["url"].rstrip("/")
    return found


class PrefillRelay:
    """On a decode instance: relays a command to its prefill instance (found by bootstrap port
    in the router's worker list, cached and read again on a miss)."""

    def __init__(self, router_url: str | None, timeout_s: float = 3600.0):
        self.router_url = (router_url or "").rstrip("/")
        self.timeout_s = timeout_s
        self.urls: dict[tuple[str, int], str] = {}
        self._session: Any = None

    async def session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            # no total limit: an event-stream finish lasts as long as its generation
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def prefill_url(self, host: str, port: int, sid: str | None) -> str:
        """The HTTP URL of the prefill instance with bootstrap `host:port`."""
        key = (host, port)
        if key not in self.urls:
            if not self.router_url:
                raise NoRouter(
                    "this PD decode instance got a stream command but has no router to find its "
                    "prefill instance in (s2l serve --stream-pd-router URL, or s2l serve --pd)",
                    sid,
                )
            import aiohttp

            session = await self.session()
            try:
                async with session.get(f"{self.router_url}/workers") as resp:
                    listing = orjson.loads(await resp.read())
            except (aiohttp.ClientError, orjson.JSONDecodeError) as exc:
                raise PrefillUnknown(
                    f"the router's worker list ({self.router_url}/workers) is unreadable: {exc}",
                    sid,
                ) from exc
            self.urls = prefill_urls(listing)
        url = self.urls.get(key)
        if url is None:  # a router that names the host differently: the port, if it is unique
            same_port = [u for (_, p), u in self.urls.items() if p == port]
            if len(same_port) == 1:
                url = same_port[0]
        if url is None:
            raise PrefillUnknown(
                f"no prefill instance with bootstrap port {host}:{port} in the router's workers",
                sid,
            )
        return url

    async def relay(self, body: dict, headers: Any) -> Response:
        """The prefill instance's answer to the command of `body` (a PD router's copy)."""
        import aiohttp

        command = body["session_params"].get("s2l")
        sid = command.get("stream_id") if isinstance(command, dict) else None
        host, port = str(body.get("bootstrap_host") or ""), body["bootstrap_port"]
        if not isinstance(port, int):
            raise BadBootstrap(f"bootstrap_port must be an integer: {port!r}", sid)
        url = await self.prefill_url(host, port, sid)
        forward: dict[str, Any] = {"session_params": body["session_params"]}
        if body.get("stream"):
            forward["stream"] = True
        sent = {k: headers[k] for k in RELAYED_HEADERS if k in headers}
        sent["content-type"] = "application/json"
        session = await self.session()
        try:
            resp = await session.post(f"{url}/generate", data=orjson.dumps(forward), headers=sent)
        except aiohttp.ClientError as exc:
            raise PrefillUnknown(f"prefill instance {url} unreachable: {exc}", sid) from exc
        media = resp.headers.get("content-type", "application/json")
        return StreamingResponse(_pieces(resp), status_code=resp.status, media_type=media)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def unsized(raw: bytes, status: int, media_type: str = "application/json") -> Response:
    """An answer without a Content-Length header (sent chunked). The PD router copies a decode
    answer's headers onto the error event it wraps an error body in (`data: {'error': ...}`),
    Content-Length included, so a sized error answer reaches the client cut to its own length."""

    async def once() -> AsyncIterator[bytes]:
        yield raw

    return StreamingResponse(once(), status_code=status, media_type=media_type)


async def _pieces(resp: Any) -> AsyncIterator[bytes]:
    """The prefill instance's answer as it comes (sent on chunked, for `unsized`'s reason);
    closing it (the router or client left) closes the connection to the prefill instance,
    which aborts the stream there."""
    try:
        async for piece in resp.content.iter_any():
            yield piece
    finally:
        resp.close()


_active: PrefillRelay | None = None


def relay_of(router_url: str | None) -> PrefillRelay:
    """This process's relay (one per decode instance's HTTP server)."""
    global _active
    if _active is None:
        _active = PrefillRelay(router_url)
    return _active
