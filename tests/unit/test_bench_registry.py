"""The mode and preset registries, and what the presets promise on paper."""

from __future__ import annotations

import dataclasses

import pytest

from bench.harness.budget import estimate
from bench.harness.modes import Mode, get_mode, mode_names, register
from bench.harness.presets import ALL_MODES, get_preset, preset_names, register_preset
from s2l_sglang.sched.policy import policy_names


def test_modes_are_registered_with_their_labels_and_trace_modes():
    assert mode_names() == ["wait", "warming", "sessions", "stream"]
    assert tuple(mode_names()) == ALL_MODES  # the CLI's help lists them without importing modes
    assert get_mode("stream", "fcfs").label == "stream-fcfs"
    assert get_mode("wait", "fcfs").label == "wait"  # the policy does not change `wait`
    assert get_mode("sessions").applies_to("append") and not get_mode("sessions").applies_to(
        "update"
    )
    assert all(get_mode(m).applies_to("append") for m in mode_names())
    with pytest.raises(ValueError, match="unknown mode"):
        get_mode("speculative")
    with pytest.raises(ValueError, match="already registered"):
        register("wait")(type("Again", (Mode,), {}))


def test_presets_are_registered_and_consistent():
    assert {"cpu-quick", "cpu-full", "paper-regime", "memory-pressure", "gpu"} <= set(
        preset_names()
    )
    for name in preset_names():
        p = get_preset(name)
        assert set(p.policies) <= set(policy_names()) and set(p.modes) <= set(mode_names())
        assert p.repeats >= 1 and p.bound_repeats >= 3
        for w in p.workloads:
            assert w.path.exists(), w.path
            assert w.rates and all(r > 0 for r in w.rates)
            assert set(p.workload_modes(w)) <= set(mode_names())
        if p.model_path is None:  # a CPU preset: bfloat16, as models are served
            assert p.engine_kwargs.get("dtype") == "bfloat16", name
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_preset(get_preset("gpu"))


def test_cpu_quick_is_a_smoke_run_that_fits_ten_minutes_on_paper():
    p = get_preset("cpu-quick")
    assert "smoke" in p.description and p.repeats == 1
    assert p.budget_s <= 600 and estimate(p)["total_s"] <= p.budget_s
    assert {w.name for w in p.workloads} == {"crawler", "ann"}


def test_cpu_full_has_tails_and_fits_an_hour_on_paper():
    p = get_preset("cpu-full")
    assert all(w.queries >= 100 and len(w.rates) >= 2 for w in p.workloads)
    assert p.budget_s <= 3600 and estimate(p)["total_s"] <= p.budget_s


def test_paper_regime_keeps_whole_traces_and_the_papers_rates():
    p = get_preset("paper-regime")
    assert p.max_context_tokens is None and p.paper is not None
    assert estimate(p)["total_s"] <= p.budget_s
    paper_qps = {(r.workload, r.qps) for r in p.paper.rows}
    assert all((w.name, q) in paper_qps for w in p.workloads for q in w.rates)
    assert "fcfs" in p.policies and {"wait", "stream"} <= set(p.modes)


def test_estimate_grows_with_queries_and_repeats():
    p = get_preset("cpu-quick")
    more = dataclasses.replace(
        p, workloads=tuple(dataclasses.replace(w, queries=60) for w in p.workloads)
    )
    assert estimate(more)["total_s"] > 2 * estimate(p)["total_s"]
    twice = dataclasses.replace(p, repeats=2)
    assert estimate(twice)["replays"] == 2 * estimate(p)["replays"] == 18
    assert estimate(get_preset("gpu")) is None


def test_memory_pressure_pool_is_smaller_than_what_the_streams_hold():
    p = get_preset("memory-pressure")
    assert p.delay_scale >= 10 and set(p.policies) == set(policy_names())
    queries = min(w.queries for w in p.workloads)
    assert p.engine_kwargs["max_total_tokens"] < queries * p.max_context_tokens
    assert p.engine_kwargs["max_total_tokens"] > 2 * p.max_context_tokens  # a request still fits


def test_gpu_preset_uses_an_8b_model_and_the_papers_rates():
    p = get_preset("gpu")
    assert "8B" in p.model_path and set(p.policies) == set(policy_names())
    rates = {w.name: w.rates for w in p.workloads}
    assert rates["crawler"] == (0.5, 1.0, 2.0, 4.0) and rates["ann"] == (1.0, 2.0)
