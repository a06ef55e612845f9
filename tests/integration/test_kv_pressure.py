"""No deadlock under KV pressure: more concurrent streams than the KV pool holds all complete,
for every policy and preemption mode, with output equal to non-streaming requests (float32, real
engine), and the scheduler's counters show the preemptions that made room.

Each case runs `kv_pressure_run.py` in its own process (see there why)."""

from __future__ import annotations

import json

import pytest

from s2l_sglang.config import HOST_KV_BYTES
from s2l_sglang.model import model_dir
from tests.helpers import run_own_process

pytestmark = pytest.mark.engine

# Every policy, each with a preemption mode; `auto` uses the profile shipped for this setup.
CASES = [("default", "recompute"), ("fcfs", "swap"), ("lcas", "auto"), ("mcps", "swap")]


def _kv_bytes_per_token() -> int:
    """The embedded model's KV bytes per token in float32 (the tests' dtype), from its
    config: K and V of every layer."""
    cfg = json.loads((model_dir() / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * 4


def _run_scenario(*args: str) -> dict:
    """`kv_pressure_run.py ARGS` in its own process; its JSON result."""
    return run_own_process("tests.integration.kv_pressure_run", *args)


@pytest.mark.parametrize("policy, preemption", CASES, ids=[f"{p}-{m}" for p, m in CASES])
def test_more_streams_than_kv_all_complete_with_identical_output(policy, preemption):
    result = _run_scenario(policy, preemption)
    assert sum(result["sizes"]) > result["pool"]  # the streams cannot all hold their KV at once
    assert sorted(result["outputs"]) == sorted(result["refs"]), "a stream did not complete"
    for i, ref in result["refs"].items():
        assert result["outputs"][i] == ref, i

    counters = result["counters"]
    assert counters["policy"] == policy
    # the adapter's every read works on this SGLang's live scheduler (adapter.check_contract),
    # and no hook fell back to SGLang's own behaviour (its writes: preemption, swap, accounting)
    assert counters["adapter_contract"] == [], counters["adapter_contract"]
    assert counters["hook_errors"] == 0, counters
    preempted = counters["preemptions_recompute"] + counters["preemptions_swap"]
    assert preempted > 0, counters  # the pool was too small: streams had to give up KV
    if preemption == "swap":
        # victims were swapped out; a copy the stream never took back (its turn recomputed)
        # counts as a recompute preemption (swap_copies_unused), not a swap one
        swapped = counters["preemptions_swap"] + counters["swap_copies_unused"]
        assert counters["preemption"] == "swap" and swapped > 0, counters
        assert counters["preemptions_swap"] == 0 or counters["tokens_swapped_out"] > 0
    elif preemption == "recompute":
        assert counters["preemption"] == "recompute" and counters["preemptions_swap"] == 0
    else:  # auto: the shipped profile of the embedded model on CPU was found and used
        assert counters["preemption"] == "auto", counters
        assert counters["profile"] and counters["profile"].endswith(".json")
    # the host pool (swap and auto) holds 4 GiB of this model's KV unless told otherwise: far
    # more than the device pool here (before: the device pool's size)
    if preemption == "recompute":
        assert counters["host_kv_capacity"] == 0, counters  # no host pool
    else:
        capacity = HOST_KV_BYTES // _kv_bytes_per_token()
        assert counters["host_kv_capacity"] == capacity > result["pool"], counters
    # finished streams left nothing in the host pool, before any later request came
    assert counters["host_kv_used"] == 0 and counters["host_copies"] == 0, counters
    # a copy never swapped back in counts as a recompute preemption, not a swap one
    assert counters["preemptions_swap"] >= 0 and counters["tokens_swapped_out"] >= 0


def test_a_request_whose_prefix_is_evictable_cache_gets_an_idle_streams_kv():
    """The memory-pressure stall of 2026-12-03: a request's prefix hit is evictable cache that
    its admission locks, so it needs more free KV than the pool has once a stream holds its
    context and idles. The plan must see that and preempt the stream; counting the locked
    prefix as free, it preempted nothing and SGLang admitted nothing (checked: with that count,
    this run needed the stall fallback: stalled_steps_max 16, stall_preemptions 1)."""
    result = _run_scenario("locked-prefix", "default")
    # the scenario: the stream and the request's extend do not fit beside the cached prefix,
    # but the pool's free and evictable KV together would hold them
    extend = result["prompt"] - result["cached"]
    assert result["stream"] + extend > sum(result["free_before"]) - result["cached"]
    assert result["output"] is not None, "the request was never admitted"
    assert result["output"] == result["ref"]
    counters = result["counters"]
    assert counters["preemptions_recompute"] == 1, counters  # the idle stream made room
    assert counters["stall_preemptions"] == 0 and counters["stalled_steps_max"] == 0, counters
    assert counters["hook_errors"] == 0, counters


def test_speculative_kv_leaves_room_for_a_plain_request():
    """Four streams whose contexts together outgrow the pool, all sent at once: their prefill
    stops at the pool less the reserve (no committed request seen yet: one speculative chunk,
    the device's default, at most half the pool), so a plain request sent then is admitted
    with no stream preempted; the held turns go in as the streams finish, and every output
    equals the plain request's. (Without the hold the streams filled the pool and the plain
    request recomputed one.)"""
    result = _run_scenario("reserve", "fcfs")
    assert sum(result["sizes"]) > result["pool"]
    reserve = min(result["speculative_chunk"], result["pool"] // 2)
    assert result["prompt"] < reserve  # the plain request fits in the reserve
    after = result["after_plain"]
    assert after["spec_reserve"] == reserve, after
    assert after["turns_held_for_kv"] >= 1, after
    assert after["preemptions_recompute"] == 0 and after["preemptions_swap"] == 0, after
    assert result["plain"] == result["plain_ref"]
    assert sorted(result["outputs"]) == sorted(result["refs"]), "a stream did not complete"
    for i, ref in result["refs"].items():
        assert result["outputs"][i] == ref, i
    counters = result["counters"]
    assert counters["hook_errors"] == 0 and counters["stall_lifts"] == 0, counters


def test_a_swapped_agent_loop_takes_back_the_kv_of_what_it_generated():
    """A kept-open stream (an agent waiting on its tool) holds its prompt and its generated
    tokens; swapped out while it idles, its host copy holds both (before: the prompt only, so
    its next finish prefilled the generated tokens again; this test failed so)."""
    result = _run_scenario("agent-swap", "fcfs")
    assert result["other"] < result["pool"] < result["other"] + result["history"]
    assert result["first"] == result["first_ref"]
    assert result["second"] == result["second_ref"]
    assert result["second_prompt_tokens"] == result["prompt2"]
    before, swapped = result["before"], result["swapped"]
    # the agent alone was swapped out, its KV whole: the history but the last generated
    # token (whose KV is never computed)
    assert swapped["preemptions_swap"] - before["preemptions_swap"] == 1, swapped
    out = swapped["tokens_swapped_out"] - before["tokens_swapped_out"]
    assert out == result["history"] - 1, (out, result["history"], result["prompt1"])
    # ... and taken back whole (copied in, or found in the tree: the prompt of its first turn,
    # which SGLang published): nothing it held was prefilled twice (every turn recomputes at
    # most its last token). Before, the swap-in came ahead of the preemption that made room
    # for it, found none, and dropped the copy (this failed so too).
    counters = result["counters"]
    back = counters["tokens_swapped_in"] + counters["tokens_swap_reused"]
    assert back == result["history"] - 1 and counters["swap_in_dropped"] == 0, counters
    stream = result["stream"]
    assert stream["prefilled"] <= result["prompt2"] + stream["turns"], stream
    assert counters["hook_errors"] == 0, counters
