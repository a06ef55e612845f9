"""The normalized trace: JSONL round trip, prompt layout, contexts in both modes, validation."""

from __future__ import annotations

import pytest

from bench.traces import DEFAULT_TEMPLATE, Trace, TraceEvent, read_traces, write_traces


def make_trace(mode: str = "append", **kw) -> Trace:
    default = (
        TraceEvent(0.5, mode, "alpha\n", 0.001),
        TraceEvent(1.25, mode, "beta {question}\n", None),
        TraceEvent(2.0, mode, "gamma é ✓\n", 0.004),
    )
    events = kw.pop("events", default)
    fields = dict(
        id="q1",
        workload="test",
        mode=mode,
        question="Why?",
        template=DEFAULT_TEMPLATE,
        events=tuple(events),
        meta={"pools": [[1, 2], [3]], "gold": None},
    )
    fields.update(kw)
    return Trace(**fields)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.xz", ".jsonl.gz"])
def test_round_trip_keeps_every_field(tmp_path, suffix):
    traces = [make_trace("append"), make_trace("update", id="q2")]
    path = tmp_path / f"traces{suffix}"
    assert write_traces(path, traces) == 2
    assert read_traces(path) == traces
    if suffix != ".jsonl":
        assert not path.read_bytes().startswith(b"{")  # really compressed


def test_one_query_per_line(tmp_path):
    path = tmp_path / "t.jsonl"
    write_traces(path, [make_trace(id="a"), make_trace(id="b")])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and '"id":"a"' in lines[0] and '"id":"b"' in lines[1]


def test_append_contexts_accumulate():
    trace = make_trace("append")
    assert list(trace.contexts()) == [
        "alpha\n",
        "alpha\nbeta {question}\n",
        "alpha\nbeta {question}\ngamma é ✓\n",
    ]
    assert trace.final_context == trace.context_after(2) == "alpha\nbeta {question}\ngamma é ✓\n"
    assert trace.duration == 2.0


def test_update_contexts_replace():
    trace = make_trace("update")
    assert trace.context_after(0) == "alpha\n"
    assert trace.final_context == "gamma é ✓\n"
    assert list(trace.contexts())[1] == "beta {question}\n"


def test_prompt_puts_context_first_and_question_last():
    trace = make_trace("append")
    prompt = trace.prompt(trace.final_context)
    assert prompt.startswith("Answer the question based only on the provided context.")
    assert prompt.endswith("Question: Why?")
    assert prompt.index("alpha") < prompt.index("Question: Why?")
    # placeholders inside the context are text, not template fields
    assert "beta {question}" in prompt


def test_prompt_of_growing_context_keeps_common_prefix():
    trace = make_trace("append")
    first, second = (trace.prompt(c) for c in list(trace.contexts())[:2])
    prefix = first.split("\n\nQuestion:")[0]
    assert second.startswith(prefix)


def test_rejects_unordered_events():
    with pytest.raises(ValueError, match="not ordered"):
        make_trace(events=(TraceEvent(2.0, "append", "a"), TraceEvent(1.0, "append", "b")))


def test_rejects_mixed_modes_and_bad_template():
    with pytest.raises(ValueError, match="modes differ"):
        make_trace("append", events=(TraceEvent(0.0, "update", "a"),))
    with pytest.raises(ValueError, match="template"):
        make_trace(template="no placeholders")
    with pytest.raises(ValueError, match="mode"):
        TraceEvent(0.0, "insert", "a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no events"):
        make_trace(events=())
