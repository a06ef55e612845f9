"""Streams on a prefill-decode deployment: two prefill instances, a decode instance and
sglang-router in PD mode, as real processes (`s2l serve --pd --prefill-instances 2`).

Clients use the router's address only, for plain requests and stream commands (the `/generate`
form, stream id as routing key: `StreamClient(routed=True)`). The router's manual prefill policy
keeps a stream's commands and its final turn on one prefill instance; the decode instance relays
each command to it (pd/relay.py). KV moves over TCP (Mooncake's `mooncake_tcp`). Output must
equal a single instance's (the session `server`, float32).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import requests

from frontend.client import StreamClient
from frontend.errors import InvalidSamplingParams, StreamAPIError, StreamClosed, UnknownStream
from s2l_sglang.pd.relay import prefill_urls
from s2l_sglang.procs import free_port_block
from tests.e2e.test_stream_http import CONTEXT, GREEDY, QUESTION, reference_ids

pytestmark = pytest.mark.engine

DOCS = [
    CONTEXT,
    "The Danube flows from the Black Forest to the Black Sea through ten countries. ",
    "The Elbe rises in the Krkonose mountains and reaches the North Sea at Cuxhaven. ",
    "The Loire is the longest river in France and flows into the Bay of Biscay. ",
]


@pytest.fixture(scope="module")
def pd():
    """`s2l serve --pd --prefill-instances 2`'s four processes, once per module.

    SGLang's strict idle memory check is on: KV leaked on an instance (a stream's rows not
    freed when its session closes) stops that instance, and the last test fails.
    """
    from s2l_sglang.pd.serve import PdPorts, PdSet, check_prerequisites

    check_prerequisites()  # installs nothing: missing pieces fail here, naming `make pd-deps`
    argv = ["--max-total-tokens", "16384", "--log-level", "error"]
    env = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
    ports = PdPorts.from_base(free_port_block(7), prefills=2)
    with PdSet(ports, user_argv=argv, env=env).start() as deployment:
        yield deployment


def sched_state(url: str) -> dict:
    info = requests.get(f"{url}/server_info", timeout=60).json()
    return next(s["s2l_sched"] for s in info["internal_states"] if "s2l_sched" in s)


def where(pd, sids: list[str]) -> dict[str, list[int]]:
    """stream id -> the prefill instances whose scheduler saw a turn of it."""
    states = [sched_state(url) for url in pd.prefill_urls]
    return {sid: [i for i, s in enumerate(states) if sid in s["turn_streams"]] for sid in sids}


def running(url: str) -> int:
    """Requests running or waiting on an instance (SGLang's /v1/loads)."""
    loads = requests.get(f"{url}/v1/loads", timeout=60).json()["loads"]
    return sum(load["num_running_reqs"] + load["num_waiting_reqs"] for load in loads)


async def open_on_both(
    pd, client: StreamClient, prefix: str = "pd"
) -> tuple[list[str], dict[str, list[int]]]:
    """Open streams one at a time until both prefill instances hold one (the router places an
    idle key at random: 16 all on one instance has p = 2**-15)."""
    sids: list[str] = []
    placed: dict[str, list[int]] = {}
    while len(sids) < 16 and len({tuple(on) for on in placed.values()}) < 2:
        sid = f"{prefix}-{len(sids)}"
        await client.open(sid, GREEDY, DOCS[len(sids) % len(DOCS)][:30])
        sids.append(sid)
        deadline = time.monotonic() + 120
        while not (placed := where(pd, sids))[sid] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    return sids, placed


def test_streams_through_the_pd_router_stay_on_their_prefill_instance(pd, server):
    """Every turn of a stream, its final turn included, runs on the prefill instance that holds
    it, with two prefill instances; outputs equal a single instance's; plain requests meanwhile."""

    async def run():
        async with StreamClient(pd.router_url, routed=True, tokens={}) as client:
            sids, placed = await open_on_both(pd, client)

            async def rest(i: int, sid: str) -> tuple[dict, str]:
                text = DOCS[i % len(DOCS)]
                await client.append(sid, text[30:])
                if i % 2:  # update mode on half of them: a rollback on the prefill instance
                    text = text[:30] + "Refined: " + text[30:]
                    await client.update(sid, text)
                if i == 0:  # server-sent events through the router and the relay
                    events = [out async for out in client.finish_iter(sid, QUESTION)]
                    assert len(events) > 1, events
                    return events[-1], text
                return await client.finish(sid, QUESTION), text

            plain = {"text": CONTEXT + QUESTION, "sampling_params": GREEDY}
            plains = [
                asyncio.to_thread(
                    requests.post, f"{pd.router_url}/generate", json=plain, timeout=600
                )
                for _ in range(4)
            ]
            results = await asyncio.gather(*(rest(i, sid) for i, sid in enumerate(sids)), *plains)
            return sids, placed, results[: len(sids)], results[len(sids) :]

    sids, placed, finals, plains = asyncio.run(run())
    print("streams per prefill instance:", placed)
    workers = requests.get(f"{pd.router_url}/workers", timeout=60).json()
    print("the router's prefill workers:", [w for w in workers["workers"] if "prefill" in str(w)])
    # the relay's reading of the router's own worker list finds both prefill instances
    assert sorted(prefill_urls(workers).values()) == sorted(pd.prefill_urls)
    after = where(pd, sids)
    assert all(len(on) == 1 for on in after.values()), after  # every turn on one instance
    assert after == placed  # the final turn too: no other instance saw the stream
    assert {on[0] for on in after.values()} == {0, 1}, after
    for sid, (out, text) in zip(sids, finals, strict=True):
        assert out["output_ids"] == reference_ids(server, text + QUESTION), sid
        meta = out["meta_info"]
        assert meta["id"] == sid
        # the router's copy of the final turn ran as the stream's session turn, reusing the KV
        # its prefill-only turns left (cached_tokens alone holds even unclaimed)
        assert meta["pd_claimed"] is True, (sid, meta)
        assert meta["cached_tokens"] > 0, (sid, meta)
        if sids.index(sid) % 2:
            assert meta["stream"]["invalidated"] > 0, (sid, meta)
    reference = reference_ids(server, CONTEXT + QUESTION)
    for resp in plains:
        assert resp.status_code == 200 and resp.json()["output_ids"] == reference


def test_errors_through_the_pd_router_keep_their_status(pd):
    """A bad command gets its 4xx through the PD router; the client reads our error back from the
    router's error event (every routed command says "stream": true)."""

    async def run():
        async with StreamClient(pd.router_url, routed=True, tokens={}) as client:
            with pytest.raises(UnknownStream) as unknown:
                await client.append("pd-nosuch", "x")
            with pytest.raises(InvalidSamplingParams) as invalid:
                await client.open("pd-bad", {"temperature": -1}, "x")
            return unknown.value, invalid.value

    unknown, invalid = asyncio.run(run())
    assert unknown.status == 404 and unknown.stream_id == "pd-nosuch"
    assert invalid.status == 400
    # without "stream": true the router keeps the status and message, not our code (docs/pd.md)
    body = {"session_params": {"s2l": {"op": "append", "stream_id": "pd-nosuch", "text": "x"}}}
    headers = {"x-smg-routing-key": "pd-nosuch"}
    resp = requests.post(f"{pd.router_url}/generate", json=body, headers=headers, timeout=60)
    assert resp.status_code == 404 and "unknown stream" in resp.json()["error"]["message"]


def test_a_client_gone_during_a_pd_final_turn_stops_it_on_both_instances(pd):
    """The stream is aborted on its prefill instance and the decode instance stops generating
    (4,000 tokens would take minutes here; the wait is 90 s)."""
    params = {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": True}

    async def run():
        async with StreamClient(pd.router_url, routed=True, tokens={}) as client:
            await client.open("pd-gone", params, CONTEXT)
            outputs = client.finish_iter("pd-gone", QUESTION)
            async for _ in outputs:
                break  # the first tokens came: decode runs
            assert running(pd.decode_url) >= 1
            await outputs.aclose()
            deadline = time.monotonic() + 90
            while running(pd.decode_url) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert running(pd.decode_url) == 0, "the decode instance still generates"
            with pytest.raises(StreamClosed) as closed:
                await client.status("pd-gone")
            return closed.value

    closed = asyncio.run(run())
    assert "client disconnected" in str(closed), closed


def test_no_instance_holds_a_session_afterwards(pd):
    deadline = time.monotonic() + 60
    while True:
        held = [(s["open_sessions"], s["session_slots"]) for s in map(sched_state, pd.prefill_urls)]
        if all(v == (0, 0) for v in held) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(v == (0, 0) for v in held), held


def test_plain_request_through_the_router_equals_single_instance(pd, server):
    """Every instance is still up (no stream left KV behind)."""
    assert pd.exited() is None
    body = {"text": CONTEXT + QUESTION, "sampling_params": GREEDY}
    out = requests.post(f"{pd.router_url}/generate", json=body, timeout=600)
    assert out.status_code == 200, out.text
    assert out.json()["output_ids"] == reference_ids(server, CONTEXT + QUESTION)


def test_a_killed_prefill_instance_fails_its_streams_fast_and_spares_the_others(pd, server):
    """Last in this module: it kills prefill instance 2."""

    async def run():
        async with StreamClient(pd.router_url, routed=True, tokens={}) as client:
            sids, placed = await open_on_both(pd, client, "pd-kill")
            doomed = [sid for sid, on in placed.items() if on == [1]]
            spared = [sid for sid, on in placed.items() if on == [0]]
            pd.kill("prefill 2")
            failures = []
            for sid in doomed:
                for _ in range(2):  # every next call errors, none hangs
                    started = time.monotonic()
                    with pytest.raises(StreamAPIError) as info:
                        await asyncio.wait_for(client.append(sid, "more text"), 60)
                    failures.append((sid, info.value.status, time.monotonic() - started))
            outputs = {}
            for sid in spared:
                i = sids.index(sid)
                await client.append(sid, DOCS[i % len(DOCS)][30:])
                outputs[sid] = (await client.finish(sid, QUESTION))["output_ids"], i
            return failures, outputs

    failures, outputs = asyncio.run(run())
    print("calls on the killed prefill instance's streams (stream, status, seconds):", failures)
    assert failures and all(status is not None and status >= 400 for _, status, _ in failures)
    assert max(seconds for _, _, seconds in failures) < 30, failures
    for sid, (output, i) in outputs.items():
        assert output == reference_ids(server, DOCS[i % len(DOCS)] + QUESTION), sid
