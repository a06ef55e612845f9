"""`python -m bench.by_chunks RESULTS`: speedups over waiting for the queries of one chunk, of
two or more, and of all."""

from __future__ import annotations

from bench import by_chunks
from bench.harness.report import write_json


def _run(mode: str, ttft: dict[str, float], chunks: dict[str, int]) -> dict:
    queries = [{"query": q, "chunks": chunks[q], "ttft": t} for q, t in ttft.items()]
    return {"workload": "crawler", "rate": 0.4, "mode": mode, "queries": queries}


def _result() -> dict:
    """20 one-chunk queries that streaming makes 1.25x slower (5 s against waiting's 4 s)
    and 20 of two chunks that it makes 2x faster; one stream query got no first token."""
    chunks = {f"a{i}": 1 for i in range(20)} | {f"b{i}": 2 for i in range(20)}
    wait = {f"a{i}": 4.0 + i / 100 for i in range(20)} | {f"b{i}": 4.0 + i / 100 for i in range(20)}
    stream = {q: t * (1.25 if q[0] == "a" else 0.5) for q, t in wait.items()}
    stream["b19"] = None
    return {"config": {"seed": 0}, "runs": [_run("wait", wait, chunks), _run("stream-fcfs", stream, chunks)]}  # fmt: skip


def _rows(lines: list[str]) -> dict[str, list[str]]:
    out = {}
    for line in lines[2:]:
        cols = [c.strip() for c in line.strip("|").split("|")]
        out[cols[3]] = cols[4:]
    return out


def test_each_group_gets_its_own_speedup_over_waiting():
    rows = _rows(by_chunks.table(_result()))
    assert set(rows) == {"1 chunk", "2+ chunks", "all"}
    n, p50, p95, *_ = rows["1 chunk"]
    assert n == "20" and p50.startswith("0.80x")  # 4 s / 5 s: slower than waiting
    n, p50, *_ = rows["2+ chunks"]
    assert n == "20" and p50.startswith("2.00x")
    n, *_ = rows["all"]
    assert n == "40"


def test_waiting_itself_and_runs_without_a_wait_baseline_are_not_listed():
    result = _result()
    assert all("`wait`" not in line for line in by_chunks.table(result)[2:])
    result["runs"] = result["runs"][1:]  # no wait run
    assert by_chunks.table(result)[2:] == []


def test_main_prints_a_table_per_file(tmp_path, capsys):
    write_json(_result(), tmp_path / "results.json")
    by_chunks.main([str(tmp_path / "results.json")])
    out = capsys.readouterr().out
    assert f"## {tmp_path / 'results.json'}" in out
    assert "| crawler | 0.4 | `stream-fcfs` | 1 chunk | 20 | 0.80x" in out


def test_prefilled_ahead_is_the_mean_over_records_and_counts_those_with_none():
    result = _result()
    for run in result["runs"]:
        for q in run["queries"]:
            q["prompt_tokens"] = 1000
            # waiting: nothing ahead; streams: b-queries had 600 ahead except b0 and b1
            left = 1000 if run["mode"] == "wait" or q["query"] in ("b0", "b1") else 400
            q["unprefilled_at_finish"] = left if q["query"][0] == "b" else 1000
    result["runs"][1]["queries"][0].pop("unprefilled_at_finish")  # a0: not known
    result["runs"][1]["queries"].append(  # failed: not counted, as in the harness's summary
        {"query": "c0", "chunks": 2, "ttft": None, "first_token_at": None, "error": "timeout",
         "prompt_tokens": 1000, "unprefilled_at_finish": 1000}
    )  # fmt: skip
    rows = _rows(by_chunks.table(result))
    assert rows["2+ chunks"][3:5] == ["540", "2 of 20"]  # 18 * 600 / 20
    assert rows["1 chunk"][3:5] == ["0", "19 of 19"]
    assert rows["all"][3:5] == ["277", "21 of 39"]  # 10,800 / 39
    result["runs"][1]["queries"] = [q for q in result["runs"][1]["queries"] if q["query"][0] == "a"]
    for q in result["runs"][1]["queries"]:
        q.pop("unprefilled_at_finish", None)
    assert _rows(by_chunks.table(result))["1 chunk"][3:5] == ["-", "-"]


def test_finals_that_carried_a_queued_turn_are_counted_where_records_say():
    result = _result()
    assert _rows(by_chunks.table(result))["2+ chunks"][5] == "-"  # no record says
    for q in result["runs"][1]["queries"]:
        q["extra"] = {"promoted": 256 if q["query"] in ("b0", "b1", "b2") else 0}
    result["runs"][1]["queries"][5]["extra"] = {}  # a5: not known
    rows = _rows(by_chunks.table(result))
    assert rows["2+ chunks"][5] == "3 of 20"
    assert rows["1 chunk"][5] == "0 of 19"
    assert rows["all"][5] == "3 of 39"
