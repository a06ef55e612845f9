"""The real harness on the real engine: 2 tiny update-mode queries, `wait` and our stream under
two policies, interleaved on one engine with 2 repeats; and the per-chunk cost benchmark."""

from __future__ import annotations

import math
from collections import Counter

import orjson
import pytest

from bench.harness.presets import Preset, WorkloadSpec
from bench.harness.report import write_all
from bench.harness.runner import run_bench
from bench.micro_chunk import measure
from bench.turn_trace import read_events, record_turns, summary

pytestmark = pytest.mark.engine


def test_bench_interleaves_modes_and_policies_on_one_engine(engine, tmp_path):
    preset = Preset(
        name="smoke",
        description="2 tiny ANN queries",
        workloads=(WorkloadSpec("ann", rates=(2.0,), queries=2),),
        policies=("default", "fcfs"),
        modes=("wait", "stream"),
        max_context_tokens=120,
        delay_scale=0.3,  # the session engine's idle timeout is 3 s
        drain_timeout_s=120.0,
        repeats=2,
        probe_tokens=200,
    )
    try:
        result = run_bench(preset, engine=engine, progress=False, command="smoke")
    finally:
        if hasattr(engine, "set_stream_policy"):
            engine.set_stream_policy("default")  # as the other tests expect it
    runs = result["runs"]
    switching = result["interleave"]["policy_switching"]
    assert switching == hasattr(engine, "set_stream_policy")
    if not switching:  # the fallback on a given engine: its one policy
        pytest.skip("this engine cannot switch policies: one policy per engine start")
    assert [r["order"] for r in runs] == list(range(6))
    assert Counter((r["mode"], r["repeat"]) for r in runs) == {
        (m, k): 1 for m in ("wait", "stream-default", "stream-fcfs") for k in (0, 1)
    }
    assert {r["policy"] for r in runs if r["mode"] == "stream-fcfs"} == {"fcfs"}
    for run in runs:
        s = run["summary"]
        assert s["queries"] == 2 and s["failed"] == 0, s["errors"]
        # the scheduler's figures are this replay's: its counts (2 final contexts or plain
        # requests admitted), its maxima (set going again before it: nothing speculative
        # admits ahead of a plain request in a `wait` replay), states as they ended (the
        # automatic reserve is at least one speculative chunk, or half this small pool)
        sched = run["sched"]
        assert run["sched_maxima"] == "replay"
        assert sched["committed_admitted"] == 2, (run["mode"], sched)
        if run["mode"] == "wait":
            assert sched["speculative_ahead_max"] == 0, sched
        assert sched["spec_reserve"] >= 64, sched
        assert 0 < s["ttft_s"]["p50"] < 60 and s["ttft_s"]["p95"] is None  # 2 samples: no p95
        assert all(q["ttft"] > 0 and q["e2e"] >= q["ttft"] for q in run["queries"])
        assert 0 < run["probe_s"] < 60 and "flagged" in run["drift"]
    # the bound: 3 samples per query, spread over the 6 replays (one per replay here)
    samples = result["lower_bound"]["samples_s"]["0"]["ann"]
    assert len(samples) == 2 and all(len(v) == 3 for v in samples.values())
    assert [r["bound_samples"] for r in runs] == [1] * 6
    bounds = result["lower_bound"]["ttft_s"]["ann"]
    assert all(b == min(samples[q]) and 0 < b < 60 for q, b in bounds.items())
    by = {c["mode"]: c for c in result["comparisons"]}
    assert by["stream-fcfs"]["ttft_s"]["n"] == 4 and by["stream-fcfs"]["repeats"] == 2
    sp = by["stream-fcfs"]["speedup"]["p50"]
    assert sp["value"] > 0 and sp["lo"] <= sp["value"] <= sp["hi"]
    assert by["stream-fcfs"]["speedup"]["p95"]["insufficient"] == "n<20"
    assert not math.isinf(by["stream-fcfs"]["completion_ratio"])
    # Same prompts: the stream's final prompt is token-exact with the plain request's.
    wait = {q["query"]: q for r in runs if r["mode"] == "wait" for q in r["queries"]}
    for q in (q for r in runs if r["mode"].startswith("stream") for q in r["queries"]):
        assert q["prompt_tokens"] == wait[q["query"]]["prompt_tokens"] > 0
        assert q["output_tokens"] == 1
        # the stream's counters reach the record: a queued turn the final carried, or none
        assert isinstance(q["extra"]["promoted"], int) and q["extra"]["promoted"] >= 0

    paths = write_all(result, tmp_path)
    data = orjson.loads((tmp_path / "results.json").read_bytes())
    assert data["comparisons"][0]["ttft_s"]["n"] == 4
    md = (tmp_path / "results.md").read_text()
    assert "`stream-fcfs`" in md and "## Replays in run order" in md
    assert all(p.stat().st_size > 0 for p in paths)


def test_bench_stream_nopub_replays_run_with_publication_switched_off(engine):
    preset = Preset(
        name="smoke-nopub",
        description="2 tiny ANN queries, publication A/B",
        workloads=(WorkloadSpec("ann", rates=(2.0,), queries=2),),
        policies=("fcfs",),
        modes=("wait", "stream", "stream-nopub"),
        max_context_tokens=120,
        delay_scale=0.3,
        drain_timeout_s=120.0,
        repeats=1,
        probe_tokens=200,
        lower_bound=False,
    )
    try:
        result = run_bench(preset, engine=engine, progress=False, command="smoke")
    finally:
        engine.set_stream_policy("default")
        engine.set_publish_at_close(True)
    runs = {r["mode"]: r for r in result["runs"]}
    assert set(runs) == {"wait", "stream-fcfs", "stream-nopub-fcfs"}
    assert runs["stream-nopub-fcfs"]["publish_at_close"] is False
    assert runs["stream-fcfs"]["publish_at_close"] is runs["wait"]["publish_at_close"] is True
    for run in runs.values():
        assert run["summary"]["failed"] == 0, run["summary"]["errors"]
    # each stream closed after its answer: published with the engine's setting, not without
    assert runs["stream-fcfs"]["sched"]["streams_published"] == 2
    assert runs["stream-nopub-fcfs"]["sched"]["streams_published"] == 0
    assert engine.sched_counters()["publish_at_close"] is True  # the engine's own, restored
    by = {c["mode"]: c for c in result["comparisons"]}
    assert by["stream-nopub-fcfs"]["ttft_s"]["n"] == 2


def test_micro_chunk_measures_each_append_on_the_engine(engine):
    curves = measure(engine, 96, chunk=16, every=2, methods=("stream", "sessions", "warming"),
                     progress=False)  # fmt: skip
    for name, points in curves.items():
        assert len(points) == 3, name
        assert all(0 < p["ack_s"] < 30 for p in points)
        contexts = [p["context_tokens"] for p in points]
        assert contexts == sorted(contexts) and contexts[-1] >= 80
    assert all(p["call_s"] > 0 for p in curves["stream"])
    assert all(p["call_s"] is None for p in curves["warming"])
    assert [p["context_tokens"] for p in curves["warming"]] == [32, 64, 96]


def test_turn_trace_records_each_turn_of_a_stream(engine, tmp_path):
    path = tmp_path / "turns.jsonl"
    restore = record_turns(path)
    try:
        engine.open_stream("traced-1", {"max_new_tokens": 1}, "The quick brown fox " * 30)
        out = engine.finish("traced-1", "jumps over the lazy dog. What jumps?")
    finally:
        restore()
    events = [e for e in read_events(path) if e["sid"] == "traced-1"]
    contexts = [e["ctx"] for e in events if "ctx" in e]
    turns = [e for e in events if "rid" in e]
    assert contexts and contexts[-1] == out["meta_info"]["prompt_tokens"]
    assert turns[-1]["final"] and turns[-1]["ran"] and turns[-1]["t1"] >= turns[-1]["t0"]
    turns_total = out["meta_info"]["stream"]["turns"]
    assert len(turns) == turns_total  # every turn the stream counted, once
    assert summary(events)["finals"] == 1
