"""`s2l profile` records its prefill step on the real engine, and an engine started without a
`speculative_chunk` takes the chunk chosen from that profile, in the stream manager and in the
scheduler alike. Runs `measured_chunk_run.py` in its own process (see there). The unit side
(the rule, a given chunk winning, old profiles): tests/unit/test_measured_chunk.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_own_process

pytestmark = pytest.mark.engine


def test_a_profiled_step_sets_the_chunk_of_both_processes(tmp_path):
    out = run_own_process("tests.integration.measured_chunk_run", str(tmp_path))
    assert Path(out["profile"]).parent == tmp_path
    # the profiling engine's step, recorded: its points up to it took one step each
    assert out["step_tokens"] is not None and out["step_tokens"] >= 512
    assert out["chunk"] is not None and out["chunk"] % 64 == 0
    assert out["source"] == f"profile {out['profile']}"
    assert out["manager_chunk"] == out["chunk"]  # the manager's turns
    assert out["scheduler_chunk"] == out["chunk"]  # the scheduler's step cap
