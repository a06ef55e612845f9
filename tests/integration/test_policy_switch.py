"""The stream policy switches at run time on the running engine (SGLang's IPC, our message)."""

from __future__ import annotations

import pytest

from tests.integration.test_streams import CONTEXT, GREEDY, QUESTION, reference

pytestmark = pytest.mark.engine


def test_the_policy_switches_at_run_time_and_streams_keep_their_output(engine):
    assert engine.sched_counters()["policy"] == "default"  # StreamEngine's default reached it
    try:
        for name in ("lcas", "mcps"):
            engine.set_stream_policy(name)
            assert engine.sched_counters()["policy"] == name
            sid = f"switch-{name}"
            engine.open_stream(sid, GREEDY, CONTEXT[:80])
            engine.append(sid, CONTEXT[80:])
            out = engine.finish(sid, QUESTION)
            assert out["output_ids"] == reference(engine, CONTEXT + QUESTION)["output_ids"]
        with pytest.raises(ValueError, match="unknown policy"):
            engine.set_stream_policy("fastest")
        assert engine.sched_counters()["policy"] == "mcps"  # a refused name changes nothing
    finally:
        engine.set_stream_policy("default")
