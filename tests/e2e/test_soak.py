"""A soak of the stream routes: a few hundred streams with faults, against one server.

Each stream draws (seeded) a life: its chunks arrive as appends and as updates that refine a
draft, and it ends in one of several ways: a finish read whole (over events or as one JSON
answer), a finish read slowly, an abort, a client that disconnects after the first output, a
stream left for the reaper, or a bad call in the middle (refused with a 4xx, the stream goes
on). Streams run 12 at a time. Checked:
- every finished stream's output equals a plain `/generate` of its final text (greedy,
  float32);
- no call got a 5xx, and no 200 carried an error;
- the server stays healthy, and KV, sessions and host copies return to idle (the module
  fixture `no_stream_left_behind`).
The figures are printed (`-s`) and kept in docs/robustness.md.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from contextlib import aclosing

import aiohttp
import pytest

from frontend import StreamAPIError, StreamClient, StreamClosed
from tests.helpers import fresh_salt

STREAMS = 240
CONCURRENCY = 12
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
PIECES = [
    "The Rhine rises in the Swiss Alps and flows to the North Sea. ",
    "The Danube flows from the Black Forest to the Black Sea. ",
    "The Loire is the longest river entirely in France. ",
    "The Elbe rises in the Czech Republic and reaches the North Sea at Cuxhaven. ",
    "The Po crosses northern Italy from the Cottian Alps to the Adriatic. ",
    "The Tagus is the longest river of the Iberian Peninsula. ",
]
QUESTIONS = ["\nQuestion: Which river is named first?\nAnswer:", "\nQ: Name one sea.\nA:"]
ENDINGS = ("finish", "finish_json", "slow_reader", "abort", "disconnect", "reaped", "bad_call")


def life(rng: random.Random) -> dict:
    """One stream's plan: its final context, how its chunks arrive, how it ends."""
    final = rng.sample(PIECES, rng.randint(1, 3))
    ops: list[tuple[str, str]] = []
    if rng.random() < 0.4:  # update mode: a draft first, then the refined context
        draft = rng.sample(PIECES, 2)
        ops.append(("append", "".join(draft)))
        ops.append(("update", "".join(final)))
    else:  # append mode, cut inside words
        text = "".join(final)
        cuts = sorted(rng.sample(range(1, len(text)), min(3, len(text) - 1)))
        ops += [("append", text[a:b]) for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return {
        "context": "".join(final),
        "question": rng.choice(QUESTIONS),
        "ops": ops,
        "gaps": [rng.uniform(0, 0.05) for _ in ops],
        "ending": rng.choice(ENDINGS),
    }


async def _reference(session: aiohttp.ClientSession, server, text: str, cache: dict) -> list:
    if text not in cache:
        body = {"text": text, "sampling_params": GREEDY, "cache_salt": fresh_salt()}
        async with session.post(f"{server.url}/generate", json=body) as resp:
            assert resp.status == 200, await resp.text()
            cache[text] = (await resp.json())["output_ids"]
    return cache[text]


async def _one(client: StreamClient, server, n: int, plan: dict, tally: Counter, refs, session):
    sid = f"soak-{n}"
    await client.open(sid, GREEDY)
    for (op, text), gap in zip(plan["ops"], plan["gaps"], strict=True):
        await asyncio.sleep(gap)
        await (client.append(sid, text) if op == "append" else client.update(sid, text))
    ending, question = plan["ending"], plan["question"]
    if ending == "bad_call":  # refused, harmless: the stream goes on to a normal finish
        for bad in ({"stream_id": sid, "text": 5}, {"stream_id": sid, "nope": 1}):
            try:
                await client.command("append", bad)
                raise AssertionError("a bad call was accepted")
            except StreamAPIError as exc:
                assert exc.status == 400, exc
                tally["refused"] += 1
        try:
            await client.finish(sid, question, {"max_new_tokens": "x"})
            raise AssertionError("bad sampling parameters were accepted")
        except StreamAPIError as exc:
            assert exc.code == "invalid_sampling_params", exc
            tally["refused"] += 1
        ending = "finish"
    if ending == "abort":
        await client.abort(sid)
    elif ending == "reaped":
        pass  # the server's 3 s idle timeout ends it
    elif ending == "disconnect":
        async with aclosing(client.finish_iter(sid, question)) as outputs:
            async for _ in outputs:
                break  # the client goes away after the first output
    else:
        if ending == "finish_json":
            out = await client.finish(sid, question)
        else:
            out = None
            async for item in client.finish_iter(sid, question):
                out = item
                if ending == "slow_reader":
                    await asyncio.sleep(0.05)
        ref = await _reference(session, server, plan["context"] + question, refs)
        assert out["output_ids"] == ref, (sid, plan)
        tally["outputs_equal"] += 1
    tally[plan["ending"]] += 1


@pytest.mark.timeout(1200)
async def test_soak_of_streams_with_faults(server):
    rng = random.Random(20261201)
    plans = [life(rng) for _ in range(STREAMS)]
    tally: Counter = Counter()
    refs: dict = {}
    gate = asyncio.Semaphore(CONCURRENCY)
    async with StreamClient(server.url, api_key=server.api_key) as client:
        async with aiohttp.ClientSession(headers=server.headers) as session:

            async def run(n: int, plan: dict) -> None:
                async with gate:
                    try:
                        async with asyncio.timeout(300):
                            await _one(client, server, n, plan, tally, refs, session)
                    except TimeoutError:
                        raise AssertionError(f"stream soak-{n} hung: {plan}") from None

            await asyncio.gather(*(run(n, plan) for n, plan in enumerate(plans)))
            # the streams left to the reaper are reaped
            reaped = [f"soak-{n}" for n, p in enumerate(plans) if p["ending"] == "reaped"]
            async with asyncio.timeout(120):  # all of them: the idle timeout is 3 s
                for sid in reaped:
                    while True:
                        try:
                            await client.status(sid)
                        except StreamClosed as exc:
                            assert "idle" in exc.message, exc
                            break
                        await asyncio.sleep(0.2)
            async with session.get(f"{server.url}/health") as resp:
                assert resp.status == 200
    print(f"soak: {STREAMS} streams, {dict(tally)}")
    assert sum(tally[e] for e in ENDINGS) == STREAMS
    assert tally["outputs_equal"] >= STREAMS // 3
