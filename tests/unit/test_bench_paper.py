"""The paper's regime: its estimated prefill rate, equal utilization on this machine, the
stretched timeline, and which of the paper's rows a run covers."""

from __future__ import annotations

import pytest

from bench.harness.paper import (
    PAPER_PREFILL_TOK_S,
    PAPER_ROWS,
    PaperRegime,
    calibrate,
    paper_name_for,
    paper_rows_for,
)
from bench.harness.queries import Chunk, Query, scaled


def test_the_papers_rate_is_the_stated_estimate():
    assert PAPER_PREFILL_TOK_S == pytest.approx(989.5e12 * 0.4 * 2 / (2 * 8.03e9))
    assert 49_000 < PAPER_PREFILL_TOK_S < 49_500
    assert "49,290 tokens/s" in PaperRegime().source


def test_local_rates_keep_the_papers_utilization():
    regime = PaperRegime()
    assert regime.utilization("crawler", 4.0) == pytest.approx(4 * 8889 / PAPER_PREFILL_TOK_S)
    local = regime.local_qps("crawler", 4.0, local_tok_s=650.0, local_tokens=5569.0)
    assert local * 5569.0 / 650.0 == pytest.approx(regime.utilization("crawler", 4.0))
    assert regime.local_qps("ann", 2.0, 650.0, 5625.0) < regime.local_qps("ann", 2.0, 1300, 5625)
    assert regime.delay_scale(650.0) == pytest.approx(PAPER_PREFILL_TOK_S / 650.0)
    with pytest.raises(ValueError):
        regime.delay_scale(0.0)


def test_calibration_maps_each_rate_and_the_rows_it_covers():
    cal = calibrate(PaperRegime(), {"crawler": [1.0, 4.0], "mine": [2.0]}, 1000.0,
                    {"crawler": 5000.0, "mine": 4000.0}, {"mine": "ann"})  # fmt: skip
    assert cal["delay_scale"] == pytest.approx(PAPER_PREFILL_TOK_S / 1000.0)
    c4 = cal["rates"]["crawler"][1]
    assert c4["paper_qps"] == 4.0 and c4["local_qps"] == pytest.approx(c4["utilization"] / 5)
    mine = cal["rates"]["mine"][0]
    assert mine["utilization"] == pytest.approx(2 * 13006 / PAPER_PREFILL_TOK_S)  # as ann
    rows = paper_rows_for(cal, PAPER_ROWS)
    got = {(r["workload"], r["qps"], r["percentile"]) for r in rows}
    assert got == {("crawler", 1.0, "p50"), ("crawler", 4.0, "p50"), ("crawler", 4.0, "p95"),
                   ("mine", 2.0, "p95")}  # fmt: skip
    assert next(r for r in rows if r["workload"] == "mine")["speedup"] == 2.3


def test_trace_files_stand_for_the_papers_workload_of_their_mode():
    tokens = PaperRegime().tokens
    assert paper_name_for("crawler", "append", tokens) == "crawler"
    assert paper_name_for("mine", "update", tokens) == "ann"
    assert paper_name_for("other", "append", tokens) == "crawler"


def test_scaled_query_stretches_times_only():
    q = Query("q", "w", "append", "H:", "?", (Chunk(0.5, "a "), Chunk(2.0, "b ")))
    s = scaled(q, 40.0)
    assert [c.t for c in s.chunks] == [20.0, 80.0] and s.final_prompt == q.final_prompt
    assert s.final_t == 80.0 and q.final_t == 2.0
