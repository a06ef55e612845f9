"""The mode and preset registries, the engine plan of a preset, and `s2l bench`'s options."""

from __future__ import annotations

import argparse

import pytest

from bench.harness.modes import Mode, get_mode, mode_names, register
from bench.harness.presets import (
    ALL_MODES,
    Preset,
    WorkloadSpec,
    get_preset,
    preset_names,
    register_preset,
)
from bench.harness.runner import count_queries, plan_engines
from s2l_sglang import cli_bench
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
    assert {"cpu-quick", "memory-pressure", "gpu"} <= set(preset_names())
    for name in preset_names():
        p = get_preset(name)
        assert set(p.policies) <= set(policy_names()) and set(p.modes) <= set(mode_names())
        for w in p.workloads:
            assert w.path.exists(), w.path
            assert w.rates and all(r > 0 for r in w.rates)
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_preset(get_preset("gpu"))


def test_cpu_quick_fits_its_budget_on_paper():
    p = get_preset("cpu-quick")
    assert p.budget_s <= 600 and p.model_path is None
    assert {w.name for w in p.workloads} == {"crawler", "ann"}
    assert p.max_context_tokens and p.max_context_tokens <= 1500
    assert len(p.policies) <= 2 and all((w.queries or 99) <= 8 for w in p.workloads)


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


def test_engine_plan_shares_the_first_engine_and_starts_one_per_policy():
    plans = plan_engines(get_preset("cpu-quick"))
    assert [p.policy for p in plans] == ["default", "fcfs"]
    assert [m.label for m in plans[0].modes] == ["wait", "warming", "sessions", "stream-default"]
    assert [m.label for m in plans[1].modes] == ["stream-fcfs"]
    assert plans[0].lower_bound and not plans[1].lower_bound
    no_stream = Preset("x", "", (WorkloadSpec("ann", (1.0,)),), modes=("wait", "warming"))
    assert len(plan_engines(no_stream)) == 1


def test_count_queries_skips_modes_that_do_not_apply():
    p = Preset(
        "x", "", (WorkloadSpec("crawler", (1.0, 2.0), 3), WorkloadSpec("ann", (1.0,), 2)),
        policies=("default", "fcfs"),
    )  # fmt: skip

    class Q:
        def __init__(self, mode):
            self.mode = mode

    queries = {"crawler": [Q("append")] * 3, "ann": [Q("update")] * 2}
    # engine 1: bounds 3 + 2; crawler 2 rates x 4 modes x 3; ann 1 rate x 3 modes x 2
    # engine 2: crawler 2 x 1 x 3; ann 1 x 1 x 2
    assert count_queries(p, plan_engines(p), queries) == 5 + 24 + 6 + 6 + 2


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_overrides_the_preset():
    args = parse(
        "--preset", "memory-pressure", "--queries", "3", "--rates", "0.2,0.4",
        "--policies", "fcfs", "--modes", "wait,stream", "--max-context-tokens", "0",
        "--engine-arg", "max_total_tokens=2048", "--engine-arg", "log_level=info",
        "--delay-scale", "30", "--no-lower-bound", "--workloads", "crawler",
    )  # fmt: skip
    p = cli_bench.preset_from_args(args)
    assert [(w.name, w.queries, w.rates) for w in p.workloads] == [("crawler", 3, (0.2, 0.4))]
    assert p.policies == ("fcfs",) and p.modes == ("wait", "stream")
    assert p.max_context_tokens is None and p.delay_scale == 30.0 and not p.lower_bound
    assert p.engine_kwargs["max_total_tokens"] == 2048 and p.engine_kwargs["log_level"] == "info"
    assert p.engine_kwargs["chunked_prefill_size"] == 512  # the preset's other arguments stay
    assert cli_bench.preset_from_args(parse()).name == "cpu-quick"


def test_cli_rejects_unknown_names():
    with pytest.raises(SystemExit):
        cli_bench.preset_from_args(parse("--modes", "wait,bogus"))
    with pytest.raises(ValueError):
        cli_bench.preset_from_args(parse("--policies", "bogus"))
    with pytest.raises(SystemExit):
        parse("--engine-arg", "no-equals-sign")
    with pytest.raises(SystemExit):
        parse("--preset", "bogus")


def test_list_presets_prints_every_preset(capsys):
    assert cli_bench.main(parse("--list-presets")) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in preset_names())
