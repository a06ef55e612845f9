"""`bench.turn_trace.summary`: speculative turns that ran, and those the final turn carried."""

from bench import turn_trace


def _turn(sid, n, t0, t1, ran, delta=256, final=False):
    rid = f"{sid}::s2l-final" if final else f"{sid}::s2l{n}"
    return {"sid": sid, "rid": rid, "final": final, "keep": 0, "delta": delta, "t0": t0,
            "t1": t1, "ran": ran}  # fmt: skip


def test_summary_counts_the_queued_turns_a_final_carried_and_their_wait():
    events = [
        {"sid": "a", "ctx": 600, "t": 0.0},
        _turn("a", 0, 0.0, 0.2, True),
        _turn("a", 1, 0.2, 1.6, False),  # still queued when a's final came at 1.5
        _turn("a", 2, 0.0, 2.0, True, delta=500, final=True),
        _turn("a", 2, 1.5, 2.0, True, delta=500, final=True),
        _turn("b", 0, 1.0, 1.3, True, delta=100),
        _turn("b", 1, 1.3, 1.4, False, delta=50),  # cancelled by an update: no final yet
        _turn("c", 0, 3.0, 3.1, False, delta=10),  # cancelled before its final was sent
        _turn("c", 1, 3.5, 3.9, True, final=True),
    ]
    del events[3]  # one final per stream
    s = turn_trace.summary(events)
    assert s["speculative_ran"] == 2 and s["speculative_tokens_ran"] == 356
    assert s["carried_by_final"] == 1 and s["carried_tokens"] == 256
    assert s["carried_waited_s"] == {"p50": 1.3, "max": 1.3}  # from 0.2 to the final's 1.5
    assert s["finals"] == 2 and s["finals_that_carried_one"] == 1


def test_summary_of_streams_that_never_waited():
    s = turn_trace.summary(
        [_turn("a", 0, 0.0, 0.1, True), _turn("a", 1, 0.2, 0.5, True, final=True)]
    )
    assert s["carried_by_final"] == 0 and s["carried_waited_s"] is None
