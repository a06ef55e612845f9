"""Percentiles only from enough samples; percentile speedups with paired, seeded bootstrap
intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.harness.metrics import percentile, percentiles
from bench.harness.stats import enough, percentile_rows, speedup_ci, too_few


def by_query(values, repeats=1, scale=1.0):
    return {f"q{i}": [v * scale] * repeats for i, v in enumerate(values)}


def test_a_percentile_needs_enough_samples():
    assert not enough("p99", 99) and enough("p99", 100)
    assert not enough("p95", 19) and enough("p95", 20)
    assert not enough("p50", 1) and enough("p50", 2)
    assert too_few("p95") == "n<20" and too_few("p99") == "n<100"
    assert percentiles(range(19)) == {"p50": 9.0, "p95": None, "p99": None}
    full = percentiles(range(100))
    assert full["p99"] == pytest.approx(98.01) and full["p95"] is not None


@pytest.mark.parametrize("q", [50, 95, 99])
def test_row_percentiles_match_the_scalar_one_with_failures(q):
    rng = np.random.default_rng(1)
    x = rng.lognormal(size=(40, 23))
    x[3, 5] = math.inf
    x[9, :] = math.inf
    got = percentile_rows(x, q)
    want = [percentile(row, q) for row in x]
    assert np.allclose(got, want) and np.array_equal(np.isinf(got), np.isinf(want))


def test_speedup_is_the_ratio_of_percentiles_with_an_interval_around_it():
    rng = np.random.default_rng(0)
    base = by_query(rng.lognormal(1.0, 0.5, 60))
    mode = {k: [v[0] * rng.uniform(0.3, 0.7)] for k, v in base.items()}
    sp = speedup_ci(base, mode, "p50", seed=3)
    pooled_b = [v for vs in base.values() for v in vs]
    pooled_m = [v for vs in mode.values() for v in vs]
    assert sp["value"] == pytest.approx(percentile(pooled_b, 50) / percentile(pooled_m, 50))
    assert sp["lo"] < sp["value"] < sp["hi"] and sp["lo"] > 1.2 and sp["n"] == 60
    assert speedup_ci(base, mode, "p50", seed=3) == sp  # seeded
    assert speedup_ci(base, mode, "p50", seed=4) != sp


def test_queries_are_paired_so_a_uniform_speedup_has_no_spread():
    """Each draw takes the same queries on both sides: halving every query's TTFT gives exactly
    2x in every draw (an unpaired resample would scatter it)."""
    rng = np.random.default_rng(0)
    base = by_query(rng.lognormal(0.0, 1.0, 40), repeats=2)
    mode = {k: [v / 2 for v in vs] for k, vs in base.items()}
    sp = speedup_ci(base, mode, "p95", seed=0)
    assert sp["value"] == pytest.approx(2.0)
    assert sp["lo"] == pytest.approx(2.0) and sp["hi"] == pytest.approx(2.0)


def test_same_distribution_gives_an_interval_around_one():
    rng = np.random.default_rng(5)
    base = by_query(rng.lognormal(0.0, 0.5, 80))
    mode = by_query(rng.lognormal(0.0, 0.5, 80))
    sp = speedup_ci(base, mode, "p50", seed=1)
    assert sp["lo"] < 1.0 < sp["hi"]


def test_too_few_samples_give_no_speedup_and_repeats_count_as_samples():
    base, mode = by_query(range(1, 11)), by_query(range(1, 11), scale=0.5)
    sp = speedup_ci(base, mode, "p95")
    assert sp == {"value": None, "n": 10, "insufficient": "n<20"}
    twice = speedup_ci(by_query(range(1, 11), 2), by_query(range(1, 11), 2, 0.5), "p95")
    assert twice["n"] == 20 and twice["value"] == pytest.approx(2.0)


def test_failures_and_unequal_repeats():
    base = by_query([1.0] * 30)
    mode = by_query([0.5] * 29 + [math.inf])
    sp = speedup_ci(base, mode, "p99")
    assert sp["insufficient"] == "n<100"
    p50 = speedup_ci(base, mode, "p50")
    assert p50["value"] == pytest.approx(2.0)
    uneven = {**base, "q0": [1.0, 1.0, 1.0]}
    got = speedup_ci(uneven, by_query([0.5] * 30), "p50", draws=200)
    assert got["value"] == pytest.approx(2.0) and got["lo"] == pytest.approx(2.0)


def test_replays_that_disagree_widen_the_interval_to_span_them():
    """Two replays per mode: in the first the mode is 2x faster, in the second no faster (its
    queue had a bad stretch). Resampling queries alone keeps both replays in every draw, so the
    interval hugs the pooled value; resampling replays too draws runs of either kind and spans
    1x to 2x."""
    rng = np.random.default_rng(2)
    ttft = rng.lognormal(0.0, 0.3, 60)
    base = {f"q{i}": [t, t] for i, t in enumerate(ttft)}
    mode = {f"q{i}": [t / 2, t] for i, t in enumerate(ttft)}
    sp = speedup_ci(base, mode, "p50", seed=0)
    assert 1.0 < sp["value"] < 2.0
    assert sp["lo"] < 1.05 and sp["hi"] > 1.9


def test_replays_are_paired_by_round_so_a_machine_slower_in_one_round_adds_no_spread():
    """Round 1 ran on a machine three times slower, for both modes: drawn as pairs, every draw
    of a uniform 2x speedup is 2x (drawn apart, a slow base against a fast mode would
    scatter it)."""
    rng = np.random.default_rng(0)
    ttft = rng.lognormal(0.0, 1.0, 40)
    base = {f"q{i}": [t, 3 * t] for i, t in enumerate(ttft)}
    mode = {k: [v / 2 for v in vs] for k, vs in base.items()}
    sp = speedup_ci(base, mode, "p95", seed=0)
    assert sp["lo"] == pytest.approx(2.0) and sp["hi"] == pytest.approx(2.0)
