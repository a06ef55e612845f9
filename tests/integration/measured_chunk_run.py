"""`s2l profile` and an engine that takes its speculative chunk from the profile, run as its own
process by test_measured_chunk.py (own process for the reason given in kv_pressure_run.py: an
engine shut down in the test session takes the session's other engines and servers with it).

Usage: python -m tests.integration.measured_chunk_run PROFILE_DIR  (prints one JSON line)
"""

from __future__ import annotations

import json
import os
import sys


def run(profile_dir: str) -> dict:
    os.environ["S2L_PROFILE_DIR"] = profile_dir  # before anything looks a profile up
    from s2l_sglang.profile import run_profile
    from s2l_sglang.stream.engine import StreamEngine

    kwargs = {"max_total_tokens": 4096}
    model, path = run_profile(kwargs, repeats=1, max_tokens=512, log=lambda s: None)
    out: dict = {"profile": str(path), "step_tokens": model.step_tokens}
    eng = StreamEngine(idle_timeout=3.0, log_level="error", **kwargs)
    try:
        step = eng.engine.server_args.chunked_prefill_size
        out["chunk"] = model.speculative_chunk(1, step)
        out["source"] = eng.config.speculative_chunk_source
        out["manager_chunk"] = eng.streams.config.speculative_chunk
        out["scheduler_chunk"] = eng.sched_counters()["speculative_chunk"]
    finally:
        eng.shutdown()
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
