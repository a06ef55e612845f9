"""Percentiles with failures (+inf), the CCDF, run summaries and the comparison with `wait`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.harness.metrics import ccdf, percentile, percentiles, summarize, versus
from bench.harness.record import QueryRecord


def rec(q: str, start: float, final_at: float, ttft: float | None, mode="m", **kw) -> QueryRecord:
    r = QueryRecord(q, "w", "append", mode, 1.0, start, final_at, **kw)
    if ttft is not None:
        r.first_token_at = final_at + ttft
        r.done_at = r.first_token_at + 0.01
    else:
        r.error = "timed out"
    return r


@pytest.mark.parametrize("q", [0, 10, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_on_finite_values(q):
    x = np.random.default_rng(0).lognormal(size=37)
    assert percentile(x, q) == pytest.approx(np.percentile(x, q))


def test_failures_count_as_infinite():
    x = [1.0, 2.0, 3.0, math.inf]
    assert percentile(x, 50) == pytest.approx(2.5)
    assert percentile(x, 66) == pytest.approx(2.98)
    assert math.isinf(percentile(x, 67))  # interpolating towards the failure
    assert math.isinf(percentile(x, 99))
    assert math.isinf(percentile([math.inf, math.inf], 0))
    assert math.isnan(percentile([], 50))
    x = [float(v) for v in range(1, 101)]
    assert percentiles(x) == {"p50": 50.5, "p95": pytest.approx(95.05), "p99": pytest.approx(99.01)}
    assert math.isinf(percentiles(x[:-1] + [math.inf])["p99"])  # the failure is the tail


def test_ccdf_is_the_fraction_at_or_above_each_value_with_failures_in_the_tail():
    x, y = ccdf([3.0, 1.0, 2.0, 2.0])
    assert list(x) == [1.0, 2.0, 2.0, 3.0]
    assert list(y) == [1.0, 0.75, 0.5, 0.25]
    x, y = ccdf([1.0, math.inf])
    assert list(x) == [1.0] and list(y) == [1.0]  # the failure keeps P(TTFT >= x) at 1/2 beyond
    assert ccdf([])[0].size == 0


def test_summary_ttft_completion_bound_and_tokens():
    records = [
        rec("a", 0.0, 2.0, 0.5, prefilled=100, reused=20, invalidated=3, prompt_tokens=120),
        rec("b", 1.0, 4.0, 1.5, prefilled=50, prompt_tokens=50),
    ]
    s = summarize(records, bounds={"a": 0.25, "b": 0.5})
    assert s["queries"] == 2 and s["failed"] == 0
    assert s["ttft_s"]["p50"] == pytest.approx(1.0) and s["ttft_s"]["mean"] == pytest.approx(1.0)
    assert s["ttft_over_bound"]["p50"] == pytest.approx(2.5)  # ratios 2.0 and 3.0
    assert s["completion_s"] == pytest.approx(5.51)  # first arrival 0 to b's last token 5.51
    assert s["throughput_qps"] == pytest.approx(2 / 5.51)
    assert s["e2e_s"]["p50"] == pytest.approx((2.51 + 4.51) / 2)
    assert s["tokens"]["prefilled"] == 150 and s["tokens"]["invalidated"] == 3
    assert s["tokens"]["prompt"] == 170


def test_a_failed_query_makes_the_tail_and_the_completion_infinite():
    records = [rec(f"q{i}", 0.0, 1.0, 0.5) for i in range(19)] + [rec("b", 0.0, 1.0, None)]
    s = summarize(records)
    assert s["failed"] == 1 and s["errors"] == ["timed out"]
    assert math.isinf(s["ttft_s"]["p95"]) and math.isinf(s["completion_s"])
    assert s["ttft_s"]["mean"] == pytest.approx(0.5)  # the mean is over the finished ones only
    assert s["ttft_s"]["p99"] is None and s["ttft_s"]["n"] == 20  # p99 needs 100 samples


def test_ttfts_under_their_bound_are_faults_left_out_of_the_ratio():
    records = [rec("a", 0, 1, 1.0), rec("b", 0, 1, 0.90), rec("c", 0, 1, 0.96), rec("d", 0, 1, 3)]
    s = summarize(records, bounds={"a": 0.5, "b": 1.0, "c": 1.0})
    assert s["bound_faults"] == ["b"]  # 0.90 < 0.95 x 1.0; c (0.96) is within the margin
    assert s["ttft_over_bound"]["n"] == 2 and s["ttft_over_bound"]["p50"] == pytest.approx(1.48)


def test_versus_wait():
    base = summarize([rec("a", 0, 1, 2.0), rec("b", 0, 1, 4.0)])
    fast = summarize([rec("a", 0, 1, 0.5), rec("b", 0, 1, 1.0)])
    v = versus(fast, base)
    assert v["ttft_speedup"]["p50"] == pytest.approx(4.0)
    assert v["ttft_speedup"]["p95"] is None  # two samples: no p95
    assert v["completion_ratio"] == pytest.approx((1 + 1.0 + 0.01) / (1 + 4.0 + 0.01))
    failed = summarize([rec("a", 0, 1, None), rec("b", 0, 1, 1.0)])
    vf = versus(failed, base)
    assert vf["ttft_speedup"]["p50"] == 0.0  # a failure is infinitely slower
    assert vf["completion_ratio"] is not None and math.isinf(vf["completion_ratio"])
