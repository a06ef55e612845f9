"""`bench.version_churn`: what share of each version its successor keeps, and the summary."""

from __future__ import annotations

import pytest

from bench.version_churn import churn, shares


def test_shares_are_each_versions_common_prefix_with_the_one_before():
    v1, v2, v3 = [1, 2, 3, 4], [1, 2, 9, 9, 9], [1, 2, 9, 9, 9, 7]
    assert shares([v1, v2, v3]) == [pytest.approx(0.5), pytest.approx(1.0)]


def test_churn_counts_what_a_full_prefill_of_the_version_before_the_final_loses():
    rows = [
        ([0.0, 0.0, 1.0], 100),  # earlier versions churned; the final keeps all
        ([0.0, 0.05, 0.0], 200),  # the same history; the final rewrites everything
        ([0.5, 0.95, 0.9], 100),  # the last earlier version kept 95%
        ([0.3], 50),  # two versions only
    ]
    r = churn(rows)
    assert r["all"]["traces"] == 4
    assert r["all"]["final_keeps_under_10pct"] == 1 and r["all"]["final_keeps_over_90pct"] == 1
    assert r["all"]["tokens_lost"] == 0 + 200 + 10 + 35
    assert r["all"]["tokens_kept"] == 100 + 0 + 90 + 15
    churned = r["by_history"]["every earlier version rewrote its predecessor (all shares < 10%)"]
    assert churned["traces"] == 2 and churned["final_keeps_mean"] == pytest.approx(0.5)
    assert r["by_history"]["the last earlier version kept over 90%"]["traces"] == 1
    assert r["by_history"]["no history (two versions)"]["tokens_lost"] == 35
    assert r["by_history"]["other histories"] == {"traces": 0}
