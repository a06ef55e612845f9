"""The real harness on the real engine: 2 tiny update-mode queries, `wait` and our stream."""

from __future__ import annotations

import math

import orjson
import pytest

from bench.harness.presets import Preset, WorkloadSpec
from bench.harness.report import write_all
from bench.harness.runner import run_bench

pytestmark = pytest.mark.engine


def test_bench_replays_two_queries_two_modes(engine, tmp_path):
    preset = Preset(
        name="smoke",
        description="2 tiny ANN queries",
        workloads=(WorkloadSpec("ann", rates=(2.0,), queries=2),),
        policies=("default",),
        modes=("wait", "stream"),
        max_context_tokens=120,
        delay_scale=0.3,  # the session engine's idle timeout is 3 s
        drain_timeout_s=120.0,
    )
    result = run_bench(preset, engine=engine, progress=False, command="smoke")
    assert [r["mode"] for r in result["runs"]] == ["wait", "stream-default"]
    wait, stream = result["runs"]
    for run in result["runs"]:
        s = run["summary"]
        assert s["queries"] == 2 and s["failed"] == 0, s["errors"]
        assert 0 < s["ttft_s"]["p50"] <= s["ttft_s"]["p95"] <= s["ttft_s"]["p99"] < 60
        assert all(q["ttft"] > 0 and q["e2e"] >= q["ttft"] for q in run["queries"])
        assert 0 < s["completion_s"] < 120 and s["ttft_over_bound"]["p50"] > 0
    assert all(0 < run["probe_s"] < 60 for run in result["runs"])  # the idle-engine speed probe
    assert 0 < result["lower_bound"]["probe_s"]["ann"] < 60
    bounds = result["lower_bound"]["ttft_s"]["ann"]
    assert len(bounds) == 2 and all(0 < b < 60 for b in bounds.values())
    # Same prompts: the stream's final prompt is token-exact with the plain request's.
    by_query = {q["query"]: q for q in wait["queries"]}
    for q in stream["queries"]:
        assert q["prompt_tokens"] == by_query[q["query"]]["prompt_tokens"] > 0
        assert q["chunks"] >= 2 and q["requests"] >= 1  # chunks sent meanwhile are merged
        assert q["output_tokens"] == 1
    assert stream["vs_wait"]["ttft_speedup"]["p50"] > 0
    assert not math.isinf(stream["vs_wait"]["completion_ratio"])

    paths = write_all(result, tmp_path)
    data = orjson.loads((tmp_path / "results.json").read_bytes())
    assert data["runs"][1]["summary"]["ttft_s"]["p50"] == pytest.approx(
        stream["summary"]["ttft_s"]["p50"]
    )
    assert "`stream-default`" in (tmp_path / "results.md").read_text()
    assert all(p.stat().st_size > 0 for p in paths)
