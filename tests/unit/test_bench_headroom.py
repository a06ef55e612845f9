"""`bench.headroom`: the oracle's tokens at finish, and the summary against the streams'."""

from __future__ import annotations

import pytest

from bench.harness.queries import Chunk, Query
from bench.headroom import oracle_left, query_oracle, summarize


def test_the_oracle_keeps_the_best_common_prefix_of_any_earlier_version():
    final = [1, 2, 3, 4, 5, 6]
    # the version just before rewrote the context; an older one matches four tokens
    assert oracle_left([[1, 2, 3, 4, 9], [1, 7], final]) == 2
    assert oracle_left([final]) == 6  # a single chunk: nothing to prefill ahead
    assert oracle_left([[1, 2, 3, 4, 5, 6, 7], final]) == 0


def test_query_oracle_tokenizes_each_version_and_the_final_prompt():
    q = Query(
        id="q", workload="w", mode="update", head="H", tail="?",
        chunks=(Chunk(0.0, "ab"), Chunk(1.0, "xyz"), Chunk(2.0, "abc")),
    )  # fmt: skip
    encode = lambda text: [ord(c) for c in text]  # noqa: E731 (one character, one token)
    # versions "Hab", "Hxyz"; final "Habc?": the first version keeps 3 of its 5 tokens
    assert query_oracle(q, encode) == 2


def test_summarize_splits_the_slowest_tenth():
    rows = [(float(i), 100, 100) for i in range(9)] + [(50.0, 900, 100)]
    s = summarize(rows, margin=200)
    assert s["all"]["queries"] == 10 and s["all"]["over_margin"] == 1
    assert s["all"]["left_mean"] == pytest.approx(180.0)
    assert s["slowest_tenth"] == {
        "queries": 1, "left_mean": 900.0, "oracle_mean": 100.0, "over_margin": 1,
    }  # fmt: skip
