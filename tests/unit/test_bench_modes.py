"""What each mode sends, and when: a recording backend stands in for the engine (the real
engine runs in tests/integration/test_bench_smoke.py). One character = one token here."""

from __future__ import annotations

import asyncio

import pytest

from bench.harness.modes import get_mode
from bench.harness.queries import Chunk, Query
from bench.harness.record import QueryRecord, Timeline
from bench.harness.replay import lower_bound, replay

PARAMS = {"max_new_tokens": 1}


class Recorder:
    """A fake backend: logs (time, op, payload); requests take `delay` s (prefill-only: `warm`)."""

    target = "fake"

    def __init__(self, delay: float = 0.02, warm: float = 0.02, hang: bool = False):
        self.delay, self.warm, self.hang = delay, warm, hang
        self.log: list[tuple[float, str, object]] = []
        self.t0 = asyncio.get_running_loop().time()
        self.streams: dict[str, str] = {}
        self.sessions: dict[str, str] = {}

    def note(self, op: str, payload: object = None) -> None:
        self.log.append((asyncio.get_running_loop().time() - self.t0, op, payload))

    def ops(self, op: str) -> list:
        return [entry for entry in self.log if entry[1] == op]

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    async def generate(self, input_ids, params, rid, session_id=None):
        text = "".join(map(chr, input_ids))
        gen = params.get("max_new_tokens", 0) > 0
        self.note("generate", (rid, text, gen, session_id))
        if self.hang:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.delay if gen else self.warm)
        prompt = len(input_ids)
        if session_id is not None:
            self.sessions[session_id] += text
            prompt = len(self.sessions[session_id])
        self.note("generated", rid)
        meta = {"prompt_tokens": prompt, "cached_tokens": 0, "completion_tokens": int(gen)}
        yield {"output_ids": [7] if gen else [], "meta_info": meta}

    async def abort_request(self, rid):
        self.note("abort", rid)

    async def open_session(self, sid):
        self.note("open_session", sid)
        self.sessions[sid] = ""

    async def close_session(self, sid):
        self.note("close_session", sid)

    async def stream_open(self, sid, params, text):
        self.note("open", text)
        self.streams[sid] = text

    async def stream_append(self, sid, text):
        self.note("append", text)
        self.streams[sid] += text

    async def stream_update(self, sid, text):
        self.note("update", text)
        self.streams[sid] = text

    async def stream_finish(self, sid, text):
        self.note("finish", text)
        self.streams[sid] += text
        await asyncio.sleep(self.delay)
        meta = {
            "prompt_tokens": len(self.streams[sid]),
            "completion_tokens": 1,
            "stream": {"turns": 3, "prefilled": 40, "reused": 9, "invalidated": 4,
                       "unprefilled_at_finish": 2, "ttft_s": 0.01},
        }  # fmt: skip
        yield {"output_ids": [7], "meta_info": meta}

    async def stream_abort(self, sid):
        self.note("stream_abort", sid)


def query(mode: str, texts: list[str], times: list[float]) -> Query:
    chunks = tuple(Chunk(t, x) for t, x in zip(times, texts, strict=True))
    return Query("q1", "w", mode, "HEAD:", "|Q?", chunks)


async def run_mode(name: str, q: Query, backend: Recorder, start: float = 0.0) -> QueryRecord:
    tl = Timeline()
    backend.t0 = asyncio.get_running_loop().time()
    rec = QueryRecord(q.id, q.workload, q.mode, name, 1.0, start, start + q.final_t)
    await get_mode(name, "fcfs").run(backend, q, rec, tl, PARAMS)
    return rec


APPEND = query("append", ["aa ", "bb ", "cc "], [0.0, 0.1, 0.2])
UPDATE = query("update", ["x1 ", "x1 y2 ", "z3 "], [0.0, 0.1, 0.2])


async def test_stream_append_sends_each_chunk_at_its_time_and_the_question_last():
    b = Recorder()
    rec = await run_mode("stream", APPEND, b)
    sent = [(op, p) for _, op, p in b.log]
    assert sent == [("open", ""), ("append", "HEAD:aa "), ("append", "bb "), ("finish", "cc |Q?")]
    assert b.streams[next(iter(b.streams))] == APPEND.final_prompt
    times = [t for t, *_ in b.log]
    assert times[2] == pytest.approx(0.1, abs=0.03) and times[3] == pytest.approx(0.2, abs=0.03)
    assert rec.ttft == pytest.approx(0.02, abs=0.03) and rec.ttft > 0
    assert (rec.requests, rec.prefilled, rec.reused, rec.invalidated) == (3, 40, 9, 4)
    assert (
        rec.unprefilled_at_finish == 2
        and rec.chunks == 3
        and rec.prompt_tokens == len(APPEND.final_prompt)
    )


async def test_stream_update_replaces_the_context_then_finishes_with_the_question():
    b = Recorder()
    await run_mode("stream", UPDATE, b)
    sent = [(op, p) for _, op, p in b.log]
    assert sent == [
        ("open", ""),
        ("update", "HEAD:x1 "),
        ("update", "HEAD:x1 y2 "),
        ("update", "HEAD:z3 "),
        ("finish", "|Q?"),
    ]
    assert b.streams[next(iter(b.streams))] == UPDATE.final_prompt


async def test_single_chunk_stream_opens_empty_and_finishes_with_the_whole_prompt():
    b = Recorder()
    q = query("append", ["only "], [0.05])
    await run_mode("stream", q, b, start=0.05)
    assert [(op, p) for _, op, p in b.log] == [("open", ""), ("finish", q.final_prompt)]
    assert b.log[0][0] == pytest.approx(0.05, abs=0.03)  # opened when the query arrives
    assert b.log[1][0] == pytest.approx(0.1, abs=0.03)  # finished at the chunk's arrival


async def test_wait_sends_one_request_at_the_final_chunk():
    b = Recorder()
    rec = await run_mode("wait", APPEND, b)
    (t, _, (rid, text, gen, session)), = b.ops("generate")  # fmt: skip
    assert text == APPEND.final_prompt and gen and session is None
    assert t == pytest.approx(0.2, abs=0.03)
    assert rec.ttft == pytest.approx(0.02, abs=0.03) and rec.requests == 1
    assert rec.prefilled == len(APPEND.final_prompt) and rec.unprefilled_at_finish == rec.prefilled


async def test_warming_resends_the_prefix_without_waiting_for_it():
    b = Recorder(warm=0.5)  # warming requests slower than the chunk gaps
    rec = await run_mode("warming", APPEND, b)
    gens = b.ops("generate")
    assert [(p[1], p[2]) for _, _, p in gens] == [
        ("HEAD:aa ", False),
        ("HEAD:aa bb ", False),
        (APPEND.final_prompt, True),
    ]
    assert gens[2][0] == pytest.approx(0.2, abs=0.03)  # not held up by the warming requests
    assert rec.ttft < 0.2 and rec.requests == 3  # the warmers are still accounted for
    assert "|Q?" not in gens[1][2][1]  # the question is not known before the final chunk


async def test_sessions_send_one_turn_per_chunk_one_at_a_time():
    b = Recorder(warm=0.15)  # each turn outlasts the 0.1 s chunk gap
    rec = await run_mode("sessions", APPEND, b)
    gens, done = b.ops("generate"), b.ops("generated")
    sid = gens[0][2][3]
    assert all(p[3] == sid for _, _, p in gens)  # every turn in the one session
    assert "".join(p[1] for _, _, p in gens) == APPEND.final_prompt
    for (t_next, *_), (t_done, *_) in zip(gens[1:], done, strict=False):
        assert t_next >= t_done - 1e-3  # the client waits for each turn
    assert b.ops("open_session") and b.ops("close_session")
    assert rec.prompt_tokens == len(APPEND.final_prompt) and rec.requests == 3
    assert not get_mode("sessions").applies_to(UPDATE.mode)


async def test_replay_times_out_a_stalled_query_and_cleans_up():
    b = Recorder(hang=True)
    records = await replay(b, get_mode("sessions"), [APPEND], [0.0], 1.0, PARAMS, 0.2)
    (rec,) = records
    assert not rec.ok and "timed out" in rec.error and rec.ttft == float("inf")
    assert b.ops("abort") and b.ops("close_session")  # the turn aborted, the session closed


async def test_replay_records_errors_without_stopping_other_queries():
    class Failing(Recorder):
        async def stream_open(self, sid, params, text):
            raise RuntimeError("refused")

    b = Failing()
    other = query("append", ["zz "], [0.0])
    records = await replay(b, get_mode("wait"), [APPEND, other], [0.0, 0.05], 1.0, PARAMS, 5)
    assert all(r.ok for r in records) and [r.start for r in records] == [0.0, 0.05]
    records = await replay(b, get_mode("stream"), [APPEND], [0.0], 1.0, PARAMS, 5)
    assert records[0].error == "RuntimeError: refused"


async def test_lower_bound_caches_the_prefix_then_times_the_full_prompt():
    b = Recorder(delay=0.05)
    ttft = await lower_bound(b, APPEND, PARAMS)
    gens = [p for _, _, p in b.ops("generate")]
    assert [(p[1], p[2]) for p in gens] == [("HEAD:aa bb ", False), (APPEND.final_prompt, True)]
    assert ttft == pytest.approx(0.05, abs=0.03)


def test_ids_are_valid_stream_ids_whatever_the_query_id_holds():
    """A long query id with any characters (the crawler's are questions) still gives a stream
    id every route takes, and each id is unique."""
    from bench.harness.modes import Mode
    from s2l_sglang.stream.manager import STREAM_ID

    long_id = "pydoc-design: why does Python use methods for some functionality (list.index)" * 3
    query = type("Q", (), {"id": long_id + "::x/y?"})()
    ids = {Mode.new_id(query, "stream-fcfs") for _ in range(3)}
    assert len(ids) == 3
    assert all(STREAM_ID.fullmatch(i) for i in ids), ids
