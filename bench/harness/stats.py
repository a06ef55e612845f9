"""How much a percentile can say: the samples it needs, and bootstrap confidence intervals of
percentile speedups.

- A percentile is reported only from enough samples (`MIN_SAMPLES`): p50 from 2, p95 from 20,
  p99 from 100; below that it is None and the report prints `n<20` and so on.
- A percentile speedup is `percentile(wait TTFT) / percentile(mode TTFT)`. Its 95% interval is a
  seeded two-level bootstrap (numpy) that resamples *replays*, then *queries*, both paired: each
  draw takes repeat indices with replacement (the same ones on both sides: the modes' replays
  of one round ran back to back, interleaved, on the machine of that moment) and query ids with
  replacement, and takes each drawn query's TTFT in each drawn replay of both modes. With one
  replay per mode it is the query bootstrap alone. Resampling queries only treated a run's
  replays as one sample of the machine: where replays differ more than queries explain (an
  overloaded engine, whose queue amplifies the machine's drift), the interval was too narrow
  (two runs of one configuration gave a p99 of [0.85, 0.88] and [1.27, 1.35]). With few
  replays the replay level is coarse (3 replays: 10 distinct draws of it) and, like any
  bootstrap of k units, narrows its spread by about (k-1)/k; more repeats, or runs pooled
  with `bench.pooled`, make it finer.

Failures are +inf, as in `metrics.percentile`: a percentile that reaches a failure is +inf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

MIN_SAMPLES = {"p50": 2, "p95": 20, "p99": 100}
BOOTSTRAP_DRAWS = 2000
CI_LEVEL = 0.95


def needed(key: str) -> int:
    """Samples a percentile ("p95") needs; 1 for others."""
    return MIN_SAMPLES.get(key, 1)


def enough(key: str, n: int) -> bool:
    return n >= needed(key)


def too_few(key: str) -> str:
    """What the report prints for a percentile from too few samples: "n<20"."""
    return f"n<{needed(key)}"


def percentile_rows(x: np.ndarray, q: float) -> np.ndarray:
    """The q-th percentile of each row of `x` (linear interpolation; +inf allowed)."""
    x = np.sort(np.asarray(x, dtype=float), axis=-1)
    n = x.shape[-1]
    rank = q / 100.0 * (n - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    frac = rank - lo
    a, b = x[..., lo], x[..., hi]
    if frac == 0:
        return a
    with np.errstate(invalid="ignore"):
        out = a + (b - a) * frac
    return np.where(np.isinf(a) | np.isinf(b), np.inf, out)


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b with inf/inf and x/0 undefined (nan); a failure in b only gives 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.divide(a, b)
    return np.where((np.isinf(a) & np.isinf(b)) | (b == 0), np.nan, r)


def _matrix(by_query: Mapping[str, Sequence[float]], ids: Sequence[str]) -> np.ndarray | None:
    rows = [list(by_query[i]) for i in ids]
    if len({len(r) for r in rows}) != 1:
        return None
    return np.asarray(rows, dtype=float)


def speedup_ci(
    base: Mapping[str, Sequence[float]],
    mode: Mapping[str, Sequence[float]],
    key: str,
    seed: int = 0,
    draws: int = BOOTSTRAP_DRAWS,
) -> dict:
    """The percentile speedup of `mode` over `base` (TTFTs per query id) with its bootstrap CI.

    Returns {"value", "lo", "hi", "n"} (n: the fewer samples of the two sides), or
    {"value": None, "n", "insufficient": "n<20"} when a side has too few samples for `key`.
    Draws whose ratio is undefined (both sides failed) are left out of the interval.
    """
    q = float(key.lstrip("p"))
    ids = sorted(set(base) & set(mode))
    n = min(sum(len(base[i]) for i in ids), sum(len(mode[i]) for i in ids)) if ids else 0
    if not enough(key, n):
        return {"value": None, "n": n, "insufficient": too_few(key)}
    b, m = _matrix(base, ids), _matrix(mode, ids)
    value = float(
        _ratio(percentile_rows(_flat(base, ids), q), percentile_rows(_flat(mode, ids), q))
    )
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ids), size=(draws, len(ids)))
    if b is not None and m is not None:
        cb, cm = replay_picks(rng, draws, b.shape[1], m.shape[1])
        ratios = _ratio(
            percentile_rows(resample(b, picks, cb), q),
            percentile_rows(resample(m, picks, cm), q),
        )
    else:  # queries with different numbers of samples: queries only, one draw at a time
        ratios = np.array(
            [
                _ratio(
                    percentile_rows(_flat(base, [ids[j] for j in row]), q),
                    percentile_rows(_flat(mode, [ids[j] for j in row]), q),
                )
                for row in picks
            ]
        )
    ratios = ratios[~np.isnan(ratios)]
    alpha = (1 - CI_LEVEL) / 2 * 100
    lo, hi = np.percentile(ratios, [alpha, 100 - alpha]) if ratios.size else (np.nan, np.nan)
    return {"value": _num(value), "lo": _num(lo), "hi": _num(hi), "n": n}


def replay_picks(
    rng: np.random.Generator, draws: int, base: int, mode: int, first: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The replay level of a two-level bootstrap: each draw's replay (column) indices, with
    replacement, for a base with `base` replays and a mode with `mode`. With as many on both
    sides the draws are paired (the same indices: replay i of each mode is the same round);
    otherwise each side draws its own. `first`: row 0 is the identity (every replay once: the
    point estimate), and `draws` rows follow it. Called after the query draw, so a run of one
    replay per mode draws the same queries as before this level existed."""
    rows = draws + int(first)

    def one(k: int) -> np.ndarray:
        cols = rng.integers(0, k, size=(rows, k))
        if first:
            cols[0] = np.arange(k)
        return cols

    cb = one(base)
    return cb, (cb if mode == base else one(mode))


def resample(x: np.ndarray, picks: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """A (queries x replays) matrix's samples in each draw: the drawn queries (`picks`, draws x
    queries) in the drawn replays (`cols`, draws x replays), as (draws, queries * replays)."""
    return x[picks[:, :, None], cols[:, None, :]].reshape(len(picks), -1)


def _flat(by_query: Mapping[str, Sequence[float]], ids: Sequence[str]) -> np.ndarray:
    return np.asarray([v for i in ids for v in by_query[i]], dtype=float)


def _num(v: float) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v
