"""Latency models that set the modelled timeline of our traces, calibrated to the paper.

Our retrieval is real but fast: the crawler fetches over loopback and the ANN index holds 2,067
paragraphs in memory. The paper's crawl went over the internet and its DiskANN search ran over a
web-scale corpus on disk. So each trace's replayed time `t` comes from these models, seeded per
query, while the real local time is recorded apart in `t_measured`. The models use the paper's
published statistics (docs/stream2llm-paper.md; definitions as in the artifact's
scripts/utils/analysis/chunk_arrival_characterization.py):

Crawler (append): chunks/query mean 7.86 (max 17) counting the search, inter-chunk gap median
  700.7 ms and P95 3,078 ms, collection time mean 9.22 s (P95 16.4 s).
  - gap between consecutive accepted pages ~ LogNormal fitted to the gap median and P95
    (mu = ln 0.7007, sigma = ln(3.078 / 0.7007) / z95 = 0.90; mean 1.05 s);
  - search step ~ LogNormal with mean 9.22 - (7.86 - 1) * 1.05 = 2.02 s (the collection time
    left after the pages) and sigma 0.5 (assumed: no spread is published).
ANN search (update): updates/query mean 4.42 (max 26), gap median 36.7 ms, duration mean 4.47 s
  (P95 8.51 s).
  - the pool-change times (window starts; the first window starts with the search) are spaced
    by gaps ~ LogNormal(median 36.7 ms, sigma 1.0; the sigma is assumed, no P95 is published);
  - the search's whole duration ~ LogNormal fitted to the mean 4.47 s and P95 8.51 s
    (sigma 0.45), at least one more gap past the last change;
  - as in the artifact's replay, each pool is delivered when its window ends (the next change,
    or the end of the search for the last pool).
The number of chunks and their content come from the real retrieval, not from these models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Z95 = NormalDist().inv_cdf(0.95)


@dataclass(frozen=True)
class LogNormal:
    """X = exp(mu + sigma * N(0, 1)), in seconds."""

    mu: float
    sigma: float

    @classmethod
    def from_median_p95(cls, median: float, p95: float) -> LogNormal:
        return cls(math.log(median), math.log(p95 / median) / Z95)

    @classmethod
    def from_mean_p95(cls, mean: float, p95: float) -> LogNormal:
        """The lower-spread solution of mean = exp(mu + s^2/2), p95 = exp(mu + z95 s)."""
        disc = Z95 * Z95 - 2.0 * math.log(p95 / mean)
        if disc < 0:
            raise ValueError(f"no lognormal has mean {mean} and P95 {p95}")
        sigma = Z95 - math.sqrt(disc)
        return cls(math.log(mean) - sigma * sigma / 2.0, sigma)

    @classmethod
    def from_mean_sigma(cls, mean: float, sigma: float) -> LogNormal:
        return cls(math.log(mean) - sigma * sigma / 2.0, sigma)

    @property
    def median(self) -> float:
        return math.exp(self.mu)

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma * self.sigma / 2.0)

    def quantile(self, q: float) -> float:
        return math.exp(self.mu + self.sigma * NormalDist().inv_cdf(q))

    def sample(self, rng: np.random.Generator, size: int | None = None) -> np.ndarray | float:
        return rng.lognormal(self.mu, self.sigma, size)


# The paper's published workload statistics (seconds, tokens, counts).
PAPER = {
    "crawler": {
        "traces": 4322,
        "tokens_mean": 8889,
        "tokens_p95": 28372,
        "chunks_mean": 7.86,
        "chunks_max": 17,
        "gap_median": 0.7007,
        "gap_p95": 3.078,
        "duration_mean": 9.22,
        "duration_p95": 16.4,
    },
    "ann": {
        "traces": 4997,
        "tokens_mean": 13006,
        "tokens_p95": 30618,
        "chunks_mean": 4.42,
        "chunks_max": 26,
        "gap_median": 0.0367,
        "gap_p95": None,
        "duration_mean": 4.47,
        "duration_p95": 8.51,
    },
}

_crawl = PAPER["crawler"]
CRAWLER_PAGE_GAP = LogNormal.from_median_p95(_crawl["gap_median"], _crawl["gap_p95"])
CRAWLER_SEARCH = LogNormal.from_mean_sigma(
    _crawl["duration_mean"] - (_crawl["chunks_mean"] - 1) * CRAWLER_PAGE_GAP.mean, 0.5
)
ANN_GAP = LogNormal(math.log(PAPER["ann"]["gap_median"]), 1.0)
ANN_DURATION = LogNormal.from_mean_p95(PAPER["ann"]["duration_mean"], PAPER["ann"]["duration_p95"])


def query_rng(seed: int, index: int) -> np.random.Generator:
    """The generator for one query: independent of the order queries are processed in."""
    return np.random.default_rng([seed, index])


def crawler_timeline(num_pages: int, rng: np.random.Generator) -> tuple[float, list[float]]:
    """(search end, arrival time of each accepted page), seconds from the query's start."""
    search_end = float(CRAWLER_SEARCH.sample(rng))
    gaps = np.atleast_1d(CRAWLER_PAGE_GAP.sample(rng, num_pages))
    return search_end, [float(t) for t in search_end + np.cumsum(gaps)][:num_pages]


def ann_timeline(num_windows: int, rng: np.random.Generator) -> list[float]:
    """Delivery time of each of `num_windows` successive pools; the last is the search's end."""
    gaps = np.atleast_1d(ANN_GAP.sample(rng, num_windows))
    starts = np.concatenate([[0.0], np.cumsum(gaps[:-1])])  # window i starts at the i-th change
    end = max(float(ANN_DURATION.sample(rng)), float(starts[-1] + gaps[-1]))
    return [float(t) for t in starts[1:]] + [end]
