"""Streams on two data-parallel ranks of one server (`s2l serve --dp-size 2`), on this CPU.

SGLang's data-parallel controller opens and closes a session on every rank, and balances
requests across ranks; a request that names `routed_dp_rank` goes to that rank. The stream
manager picks a rank for each stream at open (the one with the fewest streams, then the least
load) and names it on every turn, so the rank that holds the stream's KV gets all its turns;
plain requests keep SGLang's balancing. Checked, with streams and plain requests concurrent:
- each stream's turns reached one rank, the one its status names (each rank's `s2l_sched`
  lists the streams whose turns it saw), and both ranks served streams;
- outputs equal plain `/generate` requests of the same text (greedy, float32);
- plain requests reached both ranks;
- afterwards no rank holds a session or a slot.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import API_KEY, serving
from tests.helpers import StreamCalls, fresh_salt

pytestmark = pytest.mark.engine

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
DOCS = [
    f"Report {i}: the river number {i} flows through {i + 2} countries and ends in a delta. "
    for i in range(6)
]
QUESTION = "\nQuestion: How many countries?\nAnswer:"


@pytest.fixture(scope="module")
def dp():
    # SGLang on a CPU runs one rank per NUMA node unless told which cores each rank gets
    cores = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
    argv = ["--dp-size", "2", "--stream-idle-timeout", "60"]
    with serving(argv, timeout_s=600, env=cores) as url:
        yield StreamCalls(url, {"Authorization": f"Bearer {API_KEY}"})


def rank_states(dp: StreamCalls) -> dict[int, dict]:
    info = requests.get(f"{dp.url}/server_info", headers=dp.headers, timeout=60).json()
    states = [s["s2l_sched"] for s in info["internal_states"] if "s2l_sched" in s]
    return {s["dp_rank"]: s for s in states}


def one_stream(dp: StreamCalls, i: int) -> tuple[str, int, list[int], str]:
    sid = f"dp-{i}"
    text = DOCS[i] + DOCS[(i + 1) % 6]
    opened = dp.post(
        "/stream/open", {"stream_id": sid, "sampling_params": GREEDY, "text": text[:30]}
    )
    assert opened.status_code == 200, opened.text
    assert dp.post("/stream/append", {"stream_id": sid, "text": text[30:]}).ok
    if i % 2:  # update mode on half of them
        assert dp.post("/stream/update", {"stream_id": sid, "text": "Draft. " + text}).ok
        text = "Draft. " + text
    out = dp.post("/stream/finish", {"stream_id": sid, "text": QUESTION, "stream": False})
    assert out.status_code == 200, out.text
    return sid, opened.json()["dp_rank"], out.json()["output_ids"], text


def plain(dp: StreamCalls, text: str) -> list[int]:
    body = {"text": text, "sampling_params": GREEDY, "cache_salt": fresh_salt()}
    resp = requests.post(f"{dp.url}/generate", json=body, headers=dp.headers, timeout=600)
    assert resp.status_code == 200, resp.text
    return resp.json()["output_ids"]


def test_streams_stay_on_their_rank_and_plain_requests_reach_both(dp):
    with ThreadPoolExecutor(12) as pool:
        streams = [pool.submit(one_stream, dp, i) for i in range(6)]
        plains = [pool.submit(plain, dp, DOCS[i % 6] + QUESTION) for i in range(8)]
        results = [f.result(timeout=900) for f in streams]
        [f.result(timeout=900) for f in plains]
    states = rank_states(dp)
    assert sorted(states) == [0, 1], states
    ranks = {sid: rank for sid, rank, _, _ in results}
    assert sorted(ranks.values()) == [0, 0, 0, 1, 1, 1], ranks  # fewest streams first
    for sid, rank in ranks.items():
        assert sid in states[rank]["turn_streams"], (sid, rank)
        assert sid not in states[1 - rank]["turn_streams"], (sid, rank)  # no turn elsewhere
    for rank in (0, 1):
        assert states[rank]["plain_admitted"] > 0, states[rank]  # SGLang balanced them
    for _, _, output, text in results:
        assert output == plain(dp, text + QUESTION)


def test_no_rank_holds_a_session_afterwards(dp):
    deadline = time.monotonic() + 60
    while True:
        held = {r: (s["open_sessions"], s["session_slots"]) for r, s in rank_states(dp).items()}
        if all(v == (0, 0) for v in held.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(v == (0, 0) for v in held.values()), held
