"""The mode and preset registries, what the presets promise on paper, and `s2l bench`'s
options (`bench.cli`)."""

from __future__ import annotations

import dataclasses

import pytest

from bench import cli
from bench.harness.budget import estimate
from bench.harness.modes import Mode, get_mode, mode_names, register
from bench.harness.presets import ALL_MODES, get_preset, preset_names, register_preset
from s2l_sglang.sched.policy import policy_names


def test_modes_are_registered_with_their_labels_and_trace_modes():
    assert mode_names() == ["wait", "warming", "sessions", "stream", "stream-nopub"]
    # the CLI's help lists them without importing modes; a preset's default modes are the four
    assert tuple(mode_names()) == (*ALL_MODES, "stream-nopub")
    assert get_mode("stream-nopub", "mcps").label == "stream-nopub-mcps"
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
    ab = dataclasses.replace(p, modes=(*p.modes, "stream-nopub"))  # once per policy, as stream
    assert estimate(ab)["replays"] == estimate(p)["replays"] + 2 * len(p.policies)


@pytest.mark.parametrize("name", ["memory-pressure", "memory-pressure-tails"])
def test_memory_pressure_pool_is_smaller_than_what_the_streams_hold(name):
    p = get_preset(name)
    assert p.delay_scale >= 10 and {"fcfs", "lcas", "mcps"} <= set(p.policies)
    queries = min(w.queries for w in p.workloads)
    assert p.engine_kwargs["max_total_tokens"] < queries * p.max_context_tokens
    assert p.engine_kwargs["max_total_tokens"] > 2 * p.max_context_tokens  # a request still fits


def test_the_tails_preset_has_enough_queries_for_a_p99():
    p = get_preset("memory-pressure-tails")
    assert all(w.queries >= 100 for w in p.workloads) and "wait" in p.modes


def test_gpu_preset_uses_an_8b_model_and_the_papers_rates():
    p = get_preset("gpu")
    assert "8B" in p.model_path and set(p.policies) == set(policy_names())
    rates = {w.name: w.rates for w in p.workloads}
    assert rates["crawler"] == (0.5, 1.0, 2.0, 4.0) and rates["ann"] == (1.0, 2.0)


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def test_cli_overrides_the_preset():
    args = parse(
        "--preset", "memory-pressure", "--queries", "3", "--rates", "0.2,0.4",
        "--policies", "fcfs", "--modes", "wait,stream", "--max-context-tokens", "0",
        "--engine-arg", "max_total_tokens=2048", "--engine-arg", "log_level=info",
        "--delay-scale", "30", "--no-lower-bound", "--workloads", "crawler", "--repeats", "3",
        "--bound-repeats", "4",
    )  # fmt: skip
    p = cli.preset_from_args(args)
    assert [(w.name, w.queries, w.rates) for w in p.workloads] == [("crawler", 3, (0.2, 0.4))]
    assert p.policies == ("fcfs",) and p.modes == ("wait", "stream")
    assert p.max_context_tokens is None and p.delay_scale == 30.0 and not p.lower_bound
    assert p.repeats == 3 and p.bound_repeats == 4
    assert p.engine_kwargs["max_total_tokens"] == 2048 and p.engine_kwargs["log_level"] == "info"
    assert p.engine_kwargs["chunked_prefill_size"] == 512  # the preset's other arguments stay
    assert cli.preset_from_args(parse()).name == "cpu-quick"
    assert cli.preset_from_args(parse("--preset", "paper-regime", "--lower-bound")).lower_bound


def test_cli_modes_override_replaces_per_workload_modes():
    p = cli.preset_from_args(parse("--preset", "cpu-full", "--modes", "wait,warming"))
    assert all(p.workload_modes(w) == ("wait", "warming") for w in p.workloads)
    kept = cli.preset_from_args(parse("--preset", "cpu-full"))
    assert kept.workload_modes(kept.workloads[1]) == ("wait", "stream")


def test_cli_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown mode"):
        cli.preset_from_args(parse("--modes", "wait,bogus"))
    with pytest.raises(ValueError):
        cli.preset_from_args(parse("--policies", "bogus"))
    with pytest.raises(ValueError, match="at least 1"):
        cli.preset_from_args(parse("--repeats", "0"))
    for bad in (["--engine-arg", "no-equals-sign"], ["--preset", "bogus"], ["--rates", "0,1"]):
        with pytest.raises(SystemExit):
            parse(*bad)
    assert cli.main(["--workloads", "nope"]) == 2


def test_list_presets_and_estimate_print_without_running(capsys):
    assert cli.main(["--list-presets"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in preset_names()) and "estimated" in out
    assert cli.main(["--preset", "cpu-full", "--estimate"]) == 0
    assert "cpu-full: about" in capsys.readouterr().out
