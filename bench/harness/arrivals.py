"""Poisson arrivals: seeded start offsets of a benchmark's queries.

Every mode of one (workload, rate) pair replays the same offsets (same seed), so modes are
compared on identical arrival patterns.
"""

from __future__ import annotations

import zlib

import numpy as np


def arrival_seed(seed: int, workload: str, rate: float) -> list[int]:
    """A seed for one (workload, rate) pair, stable across runs and Python versions."""
    return [seed, zlib.crc32(f"{workload}@{rate!r}".encode())]


def poisson_offsets(n: int, rate: float, seed: int | list[int]) -> np.ndarray:
    """Start offsets (seconds) of `n` queries arriving as a Poisson process of `rate` per second.

    Gaps are exponential with mean 1 / rate; the first query starts at 0.
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if n <= 0:
        return np.zeros(0)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])
