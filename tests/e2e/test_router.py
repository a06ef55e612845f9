"""Streams on two instances behind sglang-router (`s2l serve --instances 2`), on this CPU.

The router (policy `manual`, assignment `min_group`) is the one address: plain `/generate`
requests and stream commands, the latter as `/generate` requests with the stream id as routing
key (server/routed.py), sent here by the project's client (`StreamClient(routed=True)`).
Checked, with streams (half of them in update mode) and plain requests concurrent:
- each stream's turns reached one instance (each instance's `s2l_sched` lists the streams whose
  turns it saw); where the router put them is its choice (printed);
- outputs equal plain `/generate` requests of the same text (greedy, float32);
- plain requests reached both instances;
- afterwards no instance holds a session or a slot;
- an instance killed with streams open: each of its streams fails at its next call, fast, with
  an error; the other instance's streams finish as before.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import requests

from frontend.client import StreamClient
from frontend.errors import StreamAPIError
from s2l_sglang.procs import free_port_block
from tests.conftest import API_KEY
from tests.e2e.test_dp import DOCS, GREEDY, QUESTION  # the same texts as on two DP ranks

pytestmark = pytest.mark.engine

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def routed():
    """Two `s2l serve` instances (one core each) and sglang-router, as `s2l serve --instances 2`
    starts them; SGLang's strict idle memory check on in both instances."""
    from s2l_sglang.instances import InstanceSet

    argv = ["--max-total-tokens", "16384", "--log-level", "error", "--api-key", API_KEY]
    argv += ["--stream-idle-timeout", "60"]
    env = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
    with InstanceSet(2, free_port_block(4), user_argv=argv, env=env).start(600) as instances:
        yield instances


def sched_state(url: str) -> dict:
    info = requests.get(f"{url}/server_info", headers=AUTH, timeout=60).json()
    return next(s["s2l_sched"] for s in info["internal_states"] if "s2l_sched" in s)


def where(routed, sids: list[str]) -> dict[str, list[int]]:
    """stream id -> the instances whose scheduler saw a turn of it."""
    states = [sched_state(url) for url in routed.instance_urls]
    return {sid: [i for i, s in enumerate(states) if sid in s["turn_streams"]] for sid in sids}


def wait_placed(routed, sids: list[str], timeout_s: float = 120) -> dict[str, list[int]]:
    """`where`, once every stream's first turn has reached an instance's scheduler."""
    deadline = time.monotonic() + timeout_s
    while not all((placed := where(routed, sids)).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return placed


async def plain(session: aiohttp.ClientSession, url: str, text: str) -> list[int]:
    body = {"text": text, "sampling_params": GREEDY}
    async with session.post(f"{url}/generate", json=body, headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["output_ids"]


async def one_stream(client: StreamClient, i: int) -> tuple[str, list[int], str]:
    sid = f"routed-{i}"
    text = DOCS[i] + DOCS[(i + 1) % 6]
    await client.open(sid, GREEDY, text[:30])
    await client.append(sid, text[30:])
    if i % 2:  # update mode on half of them
        text = "Draft. " + text
        await client.update(sid, text)
    out = await client.finish(sid, QUESTION)
    return sid, out["output_ids"], text


def test_streams_stay_on_their_instance_and_plain_requests_reach_both(routed):
    async def run():
        async with StreamClient(routed.router_url, API_KEY, routed=True, tokens={}) as client:
            streams = [one_stream(client, i) for i in range(6)]
            plains = [plain(client.session, routed.router_url, DOCS[i % 6]) for i in range(16)]
            results = await asyncio.gather(*streams, *plains)
            return results[:6]

    results = asyncio.run(run())
    states = [sched_state(url) for url in routed.instance_urls]
    placed = where(routed, [sid for sid, _, _ in results])
    assert all(len(on) == 1 for on in placed.values()), placed  # every turn on one instance
    per_instance = [sum(on == [i] for on in placed.values()) for i in (0, 1)]
    print("streams per instance:", per_instance, placed)  # the router's choice (docs/router.md)
    for i, state in enumerate(states):
        assert state["plain_admitted"] > 0, (i, state)  # the router spread the plain requests

    async def references():
        async with aiohttp.ClientSession() as session:
            return [
                await plain(session, routed.router_url, text + QUESTION) for _, _, text in results
            ]

    for (sid, output, _), reference in zip(results, asyncio.run(references()), strict=True):
        assert output == reference, sid


def test_bad_commands_through_the_router_get_our_4xx(routed):
    """The router passes the instance's status and error through (its shape: docs/streams.md)."""
    url = f"{routed.router_url}/generate"
    no_key = {"session_params": {"s2l": {"op": "open", "stream_id": "routed-nokey"}}}
    resp = requests.post(url, json=no_key, headers=AUTH, timeout=60)
    assert resp.status_code == 400 and "x-smg-routing-key" in resp.json()["error"]["message"]
    unknown = {"session_params": {"s2l": {"op": "append", "stream_id": "routed-none", "text": "x"}}}
    resp = requests.post(
        url, json=unknown, headers={**AUTH, "x-smg-routing-key": "routed-none"}, timeout=60
    )
    assert resp.status_code == 404 and resp.json()["error"]["stream_id"] == "routed-none"


def test_no_instance_holds_a_session_afterwards(routed):
    deadline = time.monotonic() + 60
    while True:
        states = [sched_state(url) for url in routed.instance_urls]
        held = [(s["open_sessions"], s["session_slots"]) for s in states]
        if all(v == (0, 0) for v in held) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(v == (0, 0) for v in held), held


def test_a_killed_instance_fails_its_streams_fast_and_spares_the_others(routed):
    """Last in this module: it kills instance 1."""

    async def run():
        async with StreamClient(routed.router_url, API_KEY, routed=True, tokens={}) as client:
            # the router places a new key by keys in flight, at random when idle: open streams
            # one at a time until both instances hold some (16 all on one: p = 2**-15)
            sids: list[str] = []
            placed: dict[str, list[int]] = {}
            while len(sids) < 16 and len({tuple(on) for on in placed.values()}) < 2:
                sid = f"kill-{len(sids)}"
                await client.open(sid, GREEDY, DOCS[len(sids) % 6])
                sids.append(sid)
                placed = wait_placed(routed, sids)
            print("kill test placement:", placed)
            doomed = [sid for sid, on in placed.items() if on == [1]]
            spared = [sid for sid, on in placed.items() if on == [0]]
            assert doomed and spared and len(doomed) + len(spared) == len(sids), placed
            routed.kill("instance 1")
            failures = []
            for sid in doomed:
                for _ in range(3):  # every next call errors, none hangs
                    started = time.monotonic()
                    with pytest.raises(StreamAPIError) as info:
                        await asyncio.wait_for(client.append(sid, "more text"), 60)
                    failures.append((sid, info.value.status, time.monotonic() - started))
            outputs = {}
            for sid in spared:
                i = sids.index(sid)
                outputs[sid] = (await client.finish(sid, QUESTION))["output_ids"], DOCS[i % 6]
            return failures, outputs

    failures, outputs = asyncio.run(run())
    print("calls on the killed instance's streams (stream, status, seconds):", failures)
    assert all(status is not None and status >= 400 for _, status, _ in failures), failures
    assert max(seconds for _, _, seconds in failures) < 30, failures

    async def references():
        async with aiohttp.ClientSession() as session:
            alive = routed.instance_urls[0]  # key-less requests may still be sent to the dead one
            return {
                sid: await plain(session, alive, text + QUESTION)
                for sid, (_, text) in outputs.items()
            }

    expected = asyncio.run(references())
    for sid, (output, _) in outputs.items():
        assert output == expected[sid], sid
    deadline = time.monotonic() + 60
    while (held := sched_state(routed.instance_urls[0])["open_sessions"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert held == 0
