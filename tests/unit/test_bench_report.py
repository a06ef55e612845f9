"""The report: results.json (inf as "inf"), the markdown tables and closing note, the PNGs."""

from __future__ import annotations

import math

import orjson

from bench.harness.record import QueryRecord
from bench.harness.report import fmt_s, fmt_x, markdown, write_all
from bench.harness.runner import summarize_runs


def records(mode: str, workload: str, rate: float, ttfts: list[float | None]) -> list:
    out = []
    for i, ttft in enumerate(ttfts):
        r = QueryRecord(f"q{i}", workload, "append", mode, rate, float(i), float(i) + 1.0)
        if ttft is None:
            r.error = "timed out (60 s after the last final chunk)"
        else:
            r.first_token_at = r.final_at + ttft
            r.done_at = r.first_token_at
            r.prefilled, r.invalidated = 100, 7
        out.append(r)
    return out


def make_result() -> dict:
    runs = []
    for workload in ("crawler", "ann"):
        for rate in (0.5, 1.0):
            for mode, ttfts in (
                ("wait", [2.0, 2.0, 4.0]),
                ("stream-fcfs", [0.5, 1.0, 1.0]),
                ("sessions", [1.0, 1.0, None]),
            ):
                runs.append(
                    {
                        "workload": workload,
                        "trace_mode": "append",
                        "rate": rate,
                        "mode": mode,
                        "policy": "fcfs",
                        "sched": {"preemptions_recompute": 2, "preemptions_swap": 0}
                        if mode.startswith("stream")
                        else None,
                        "records": records(mode, workload, rate, ttfts),
                        "probe_s": 4.0 if (workload, mode) == ("ann", "sessions") else 1.0,
                    }
                )
    bounds = {w: {f"q{i}": 0.25 for i in range(3)} for w in ("crawler", "ann")}
    summarize_runs(runs, bounds)
    return {
        "preset": "unit",
        "description": "a synthetic result",
        "command": "s2l bench --preset unit",
        "date": "2026-01-01 00:00 UTC",
        "wall_s": 12.0,
        "machine": {"nproc": 2, "cpu_model": "Test CPU", "load_start": "1.0", "load_end": "2.0"},
        "config": {
            "model": "tiny",
            "engine_kwargs": {},
            "target": "engine",
            "workloads": [{"name": "crawler", "queries": 3, "rates": [0.5, 1.0]}],
            "seed": 0,
            "max_context_tokens": 1000,
            "delay_scale": 1.0,
            "max_new_tokens": 1,
        },
        "engines": [{"policy": "fcfs", "start_s": 40.0}],
        "lower_bound": {"method": "measured", "ttft_s": bounds},
        "sched_note": "scheduler counters",
        "runs": runs,
    }


def test_summaries_compare_with_wait_at_the_same_workload_and_rate():
    result = make_result()
    stream = next(r for r in result["runs"] if r["mode"] == "stream-fcfs")
    assert stream["vs_wait"]["ttft_speedup"]["p50"] == 2.0  # wait p50 2.0 / stream p50 1.0
    assert len(stream["queries"]) == 3 and "records" not in stream
    sessions = next(r for r in result["runs"] if r["mode"] == "sessions")
    assert math.isinf(sessions["summary"]["ttft_s"]["p99"])


def test_write_all_writes_json_markdown_and_pngs(tmp_path):
    paths = write_all(make_result(), tmp_path)
    assert {p.name for p in paths} == {
        "results.json",
        "results.md",
        "ttft_ccdf.png",
        "ttft_p95_vs_rate.png",
    }
    data = orjson.loads((tmp_path / "results.json").read_bytes())  # strict JSON: no Infinity
    sessions = next(r for r in data["runs"] if r["mode"] == "sessions")
    assert sessions["summary"]["ttft_s"]["p99"] == "inf"
    assert sessions["queries"][2]["ttft"] is None and sessions["queries"][2]["error"]
    for png in ("ttft_ccdf.png", "ttft_p95_vs_rate.png"):
        blob = (tmp_path / png).read_bytes()
        assert blob.startswith(b"\x89PNG") and len(blob) > 5000


def test_markdown_has_the_header_tables_and_closing_note(tmp_path):
    write_all(make_result(), tmp_path, plots=False)
    md = (tmp_path / "results.md").read_text()
    assert "s2l bench --preset unit" in md and "Test CPU" in md and "2026-01-01" in md
    assert md.count("## crawler (append mode)") == 2 and "## ann (append mode), 1 QPS" in md
    row = next(line for line in md.splitlines() if line.startswith("| `stream-fcfs`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "1.000"  # the speed probe
    assert cells[2] == "3/3" and cells[3] == "1.000" and cells[6] == "2.00x"
    assert cells[9] == "4.00x"  # TTFT / bound p50: 1.0 / 0.25
    assert cells[-1] == "2"  # preemptions from the scheduler counters (all by recompute)
    assert cells[-3] == "300" and cells[-2] == "21"  # prefilled and invalidated over 3 queries
    sessions_row = next(line for line in md.splitlines() if line.startswith("| `sessions`"))
    assert "2/3" in sessions_row and "fail" in sessions_row and sessions_row.endswith("n/a |")
    closing = md.split("## Closing note")[1]
    assert "| crawler | 0.5 | `stream-fcfs` | 2.00x / " in closing
    rows = [line.split("|")[1:4] for line in closing.splitlines() if line.startswith("| c")]
    assert [(w.strip(), float(r)) for w, r, _ in rows] == [("crawler", 0.5)] * 2 + [
        ("crawler", 1.0)
    ] * 2  # sorted by workload and rate, `wait` itself left out
    assert "![TTFT CCDF]" not in md  # no figures were written
    crawler, ann = md.split("## ann")[0], md.split("## ann")[1]
    assert "Warning:** the speed probe" not in crawler  # equal probes
    assert "ranged from 1.00 s to 4.00 s" in ann.split("## Closing")[0]


def test_formatting():
    assert fmt_s(0.12345) == "0.123" and fmt_s(12.345) == "12.3" and fmt_s("inf") == "fail"
    assert fmt_s(None) == "-" and fmt_x(2.345) == "2.35x" and fmt_x(None) == "-"
    assert markdown(make_result() | {"runs": []}).count("## Closing note") == 1


def test_preemptions_are_split_by_mode_when_some_swapped():
    from bench.harness.report import _preempted

    assert _preempted({"sched": None}) == "n/a"
    assert _preempted({"sched": {"preemptions_recompute": 3, "preemptions_swap": 0}}) == "3"
    swapped = {"sched": {"preemptions_recompute": 1, "preemptions_swap": 2}}
    assert _preempted(swapped) == "3 (1 recompute, 2 swap)"
