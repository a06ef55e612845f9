"""Streams on a prefill-decode deployment: prefill, decode and sglang-router as real processes.

KV moves over TCP (Mooncake's `mooncake_tcp`); the final turn of a stream goes through the router
to the decode instance. Output must equal a single instance's (the session `server`, float32).
"""

from __future__ import annotations

import pytest
import requests

from tests.e2e.test_stream_http import CONTEXT, GREEDY, QUESTION, reference_ids, sse_events
from tests.helpers import StreamCalls, free_port_block

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def pd():
    """`s2l serve --pd`'s three processes, once per module.

    SGLang's strict idle memory check is on: KV leaked on an instance (a stream's rows not
    freed when its session closes) stops that instance, and the last test fails.
    """
    from s2l_sglang.pd.serve import PdPorts, PdSet, check_prerequisites

    check_prerequisites()  # installs nothing: missing pieces fail here, naming `make pd-deps`
    argv = ["--max-total-tokens", "16384", "--log-level", "error"]
    env = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
    ports = PdPorts.from_base(free_port_block(5))
    with PdSet(ports, user_argv=argv, env=env).start() as deployment:
        yield deployment


_CALLS: dict[str, StreamCalls] = {}


def post(url: str, route: str, body: dict, **kw) -> requests.Response:
    """A stream-route call and, for a stream opened here, its token."""
    return _CALLS.setdefault(url, StreamCalls(url)).post(route, body, **kw)


def test_append_stream_through_the_router_equals_single_instance(pd, server):
    url = pd.prefill_url
    first = {"stream_id": "pd-append", "sampling_params": GREEDY, "text": CONTEXT[:40]}
    assert post(url, "/stream/open", first).status_code == 200
    assert post(url, "/stream/append", {"stream_id": "pd-append", "text": CONTEXT[40:]}).ok
    resp = post(url, "/stream/finish", {"stream_id": "pd-append", "text": QUESTION}, stream=True)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp)
    assert events[-1] == b"[DONE]"
    final = events[-2]
    assert final["output_ids"] == reference_ids(server, CONTEXT + QUESTION)
    meta = final["meta_info"]
    assert meta["id"] == "pd-append" and meta["stream"]["turns"] >= 2
    # the router's copy ran here as the stream's session turn (claimed), reusing the KV its
    # prefill-only turns left in the session (cached_tokens alone holds even unclaimed: a
    # plain request hits the radix cache too)
    assert meta["pd_claimed"] is True, meta
    assert meta["cached_tokens"] > 0
    assert requests.get(f"{url}/stream/pd-append", timeout=30).status_code == 409  # ended


def test_update_stream_through_the_router_equals_single_instance(pd, server):
    url = pd.prefill_url
    draft = {
        "stream_id": "pd-update",
        "sampling_params": GREEDY,
        "text": "A first draft. " + CONTEXT,
    }
    assert post(url, "/stream/open", draft).status_code == 200
    docs = {"stream_id": "pd-update", "documents": [CONTEXT, "Second doc."]}
    assert post(url, "/stream/update", docs).ok
    out = post(url, "/stream/finish", {"stream_id": "pd-update", "text": QUESTION, "stream": False})
    assert out.status_code == 200, out.text
    final = out.json()
    assert final["output_ids"] == reference_ids(server, CONTEXT + "\n\nSecond doc." + QUESTION)
    assert final["meta_info"]["stream"]["invalidated"] > 0


def test_plain_request_through_the_router_equals_single_instance(pd, server):
    """Last: the prefill instance is still up (no stream left KV behind)."""
    assert pd.exited() is None
    body = {"text": CONTEXT + QUESTION, "sampling_params": GREEDY}
    out = post(pd.router_url, "/generate", body)
    assert out.status_code == 200, out.text
    assert out.json()["output_ids"] == reference_ids(server, CONTEXT + QUESTION)
