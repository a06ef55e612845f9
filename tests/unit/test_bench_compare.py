"""`python -m bench.compare A B`: both runs' speedups per workload, rate, mode, percentile, and
their ratio."""

from __future__ import annotations

import copy

import pytest

from bench import compare
from bench.harness.report import write_json
from tests.unit.test_bench_report import make_result


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    a = make_result()
    b = copy.deepcopy(a)
    for c in b["comparisons"]:
        if c["mode"] == "stream-fcfs" and c["workload"] == "crawler":
            c["speedup"]["p50"]["value"] *= 1.1
    folder = tmp_path_factory.mktemp("cmp")
    write_json(a, folder / "a.json")
    write_json(b, folder / "b.json")
    return folder / "a.json", folder / "b.json"


def table(out: str) -> dict[tuple[str, ...], list[str]]:
    rows = {}
    for line in out.splitlines()[1:-1]:
        cols = line.split()
        rows[tuple(cols[:4])] = cols[4:]
    return rows


def test_prints_both_speedups_and_their_ratio(pair, capsys):
    assert compare.main([str(p) for p in pair]) == 0
    out = capsys.readouterr().out
    rows = table(out)
    # the crawler's first rate is a paper-regime local rate: matched as the paper's 1 QPS
    assert rows[("crawler", "1", "stream-fcfs", "p50")][-1] == "1.10x"
    assert rows[("ann", "1", "stream-fcfs", "p50")][-1] == "1.00x"
    assert ("ann", "2", "stream-fcfs", "p95") in rows  # ann's paper 2 QPS
    assert ("crawler", "1", "stream-fcfs", "p99") not in rows  # n<100 in both runs
    assert "B / A from 1.00 to 1.10" in out and "percentiles left out" in out
    assert not any(k[2] == "wait" for k in rows)


def test_rates_of_paper_runs_match_by_the_papers_qps(pair):
    a = compare.load(pair[0])
    b = compare.load(pair[1])
    mapped = {r["local_qps"] for w in b["paper_regime"]["rates"].values() for r in w}
    for c in b["comparisons"]:  # run B measured another prefill rate: other local rates
        if c["rate"] in mapped:
            c["rate"] *= 1.3
    for w in b["paper_regime"]["rates"].values():
        for r in w:
            r["local_qps"] *= 1.3
    assert set(compare.speedups(a)) == set(compare.speedups(b))
    assert ("ann", 2.0, "stream-fcfs", "p95") in compare.speedups(b)


def test_missing_file_is_an_error(tmp_path, capsys):
    assert compare.main([str(tmp_path / "nope.json"), str(tmp_path / "nope.json")]) == 2
    assert "error" in capsys.readouterr().err


def test_again_aggregates_the_runs_anew_instead_of_reading_the_saved_comparisons(pair, capsys):
    """Run B's saved p50 was edited to 1.1x A's; its runs are A's, so aggregated anew from
    them the two runs agree."""
    assert compare.main([*map(str, pair), "--again"]) == 0
    rows = table(capsys.readouterr().out)
    assert rows[("crawler", "1", "stream-fcfs", "p50")][-1] == "1.00x"
    again = compare.load(pair[1], again=True)
    saved = compare.load(pair[1])
    assert compare.speedups(again) != compare.speedups(saved)
