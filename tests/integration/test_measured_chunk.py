"""`s2l profile` measures the prefill step on the real engine, and an engine started without a
`speculative_chunk` takes the chunk chosen from it, in the stream manager and in the scheduler
alike (the unit side: tests/unit/test_measured_chunk.py)."""

from __future__ import annotations

import pytest

from s2l_sglang.profile import run_profile

pytestmark = pytest.mark.engine


def test_a_profiled_step_sets_the_chunk_of_both_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("S2L_PROFILE_DIR", str(tmp_path))
    kwargs = {"max_total_tokens": 4096}
    model, path = run_profile(kwargs, repeats=1, max_tokens=512, log=lambda s: None)
    assert path.parent == tmp_path
    # the profiling engine's step, recorded: the points up to it took one step each
    assert model.step_tokens is not None and model.step_tokens >= 512

    from s2l_sglang.stream.engine import StreamEngine

    eng = StreamEngine(idle_timeout=3.0, log_level="error", **kwargs)
    try:
        chunk = model.speculative_chunk(1, eng.engine.server_args.chunked_prefill_size)
        assert chunk is not None and chunk % 64 == 0
        assert eng.config.speculative_chunk_source == f"profile {path}"
        assert eng.streams.config.speculative_chunk == chunk  # the manager's turns
        assert eng.sched_counters()["speculative_chunk"] == chunk  # the scheduler's step cap
    finally:
        eng.shutdown()
    given = StreamEngine(idle_timeout=3.0, log_level="error", speculative_chunk=96, **kwargs)
    try:  # a chunk given wins over the profile
        assert given.sched_counters()["speculative_chunk"] == 96
        assert given.config.speculative_chunk_source == "given"
    finally:
        given.shutdown()
