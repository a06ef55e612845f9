"""Poisson arrivals: seeded, first query at 0, exponential gaps of mean 1 / rate."""

from __future__ import annotations

import numpy as np
import pytest

from bench.harness.arrivals import arrival_seed, poisson_offsets


def test_same_seed_same_offsets_other_seed_other_offsets():
    a = poisson_offsets(50, 2.0, 7)
    assert np.array_equal(a, poisson_offsets(50, 2.0, 7))
    assert not np.array_equal(a, poisson_offsets(50, 2.0, 8))


def test_offsets_start_at_zero_and_increase():
    x = poisson_offsets(100, 0.5, 1)
    assert x.shape == (100,)
    assert x[0] == 0.0
    assert np.all(np.diff(x) > 0)


@pytest.mark.parametrize("rate", [0.25, 1.0, 4.0])
def test_gaps_are_exponential_with_mean_one_over_rate(rate):
    gaps = np.diff(poisson_offsets(40_001, rate, 3))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    # Exponential: the standard deviation equals the mean, the median is ln 2 times the mean.
    assert gaps.std() == pytest.approx(1 / rate, rel=0.05)
    assert np.median(gaps) == pytest.approx(np.log(2) / rate, rel=0.05)


def test_higher_rate_compresses_the_same_pattern():
    slow, fast = poisson_offsets(20, 1.0, 5), poisson_offsets(20, 4.0, 5)
    assert np.allclose(slow / 4, fast)


def test_degenerate_inputs():
    assert poisson_offsets(0, 1.0, 0).size == 0
    assert np.array_equal(poisson_offsets(1, 1.0, 0), [0.0])
    with pytest.raises(ValueError):
        poisson_offsets(5, 0.0, 0)


def test_arrival_seed_is_stable_and_distinct_per_workload_and_rate():
    assert arrival_seed(0, "crawler", 1.0) == arrival_seed(0, "crawler", 1.0)
    seeds = {tuple(arrival_seed(0, w, r)) for w in ("crawler", "ann") for r in (0.5, 1.0)}
    assert len(seeds) == 4
    assert arrival_seed(0, "ann", 1.0) == [0, 926077235]  # crc32: the same on every machine
    a = poisson_offsets(10, 1.0, arrival_seed(0, "ann", 1.0))
    b = poisson_offsets(10, 1.0, arrival_seed(0, "crawler", 1.0))
    assert not np.array_equal(a, b)
