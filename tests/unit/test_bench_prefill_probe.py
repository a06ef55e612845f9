"""`bench.prefill_probe.step_fit`: the fixed and per-token cost of a prefill step."""

import pytest

from bench.prefill_probe import step_fit


def test_step_fit_recovers_the_line_and_leaves_out_multi_step_lengths():
    # 60 ms a step plus 0.33 ms a token; 1000 tokens at a 512-token step take two steps, which
    # the fit must leave out (it would add a second fixed cost)
    times = {n: 0.060 + 0.00033 * n for n in (16, 128, 256, 512)}
    times[1000] = 2 * 0.060 + 0.00033 * 1000
    fit = step_fit(times, step_tokens=512)
    assert fit["fixed_s"] == pytest.approx(0.060, abs=1e-4)
    assert fit["per_token_ms"] == pytest.approx(0.33, abs=1e-3)
    assert fit["break_even_tokens"] == 182
    # 16 tokens take 65.3 ms; twice that at 213 tokens, rounded up to a multiple of 64
    assert fit["speculative_chunk"] == 256
    assert fit["lengths"] == [16, 128, 256, 512]


def test_step_fit_needs_two_lengths_in_one_step():
    assert step_fit({256: 0.15, 1000: 0.4}, step_tokens=512) is None
    assert step_fit({256: 0.15}) is None
