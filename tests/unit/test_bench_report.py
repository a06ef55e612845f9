"""The report: per-replay summaries and drift flags, pooled comparisons with intervals,
results.json (inf as "inf"), the markdown's sections, the PNGs."""

from __future__ import annotations

import math

import orjson
import pytest

from bench.harness.aggregate import comparisons, summarize_runs
from bench.harness.paper import PaperRegime, calibrate, paper_rows_for
from bench.harness.record import QueryRecord
from bench.harness.report import _preempted, fmt_pct, fmt_s, fmt_speedup, fmt_x, markdown, write_all

N = 12  # queries per replay: 2 repeats pool 24 samples, enough for p95, not for p99
TTFTS = {"wait": 2.0, "stream-fcfs": 1.0, "sessions": 1.0}


def records(mode: str, workload: str, rate: float, fail_last: bool) -> list[QueryRecord]:
    out = []
    for i in range(N):
        r = QueryRecord(f"q{i}", workload, "append", mode, rate, float(i), float(i) + 1.0)
        r.chunks = 1 if i < N // 2 else 3  # half the contexts came whole
        if fail_last and i == N - 1:
            r.error = "timed out (60 s after the last final chunk)"
        else:
            r.first_token_at = r.final_at + TTFTS[mode] * (1 + i / N)
            r.done_at = r.first_token_at
            r.prefilled, r.invalidated, r.prompt_tokens = 100, 7, 1000
        out.append(r)
    return out


def make_result() -> dict:
    runs, order = [], 0
    for repeat in (0, 1):
        for workload in ("crawler", "ann"):
            for rate in (0.5, 1.0):
                for mode in TTFTS:
                    probe = 2.0 if (workload, mode, repeat) == ("ann", "sessions", 1) else 1.0
                    runs.append(
                        {
                            "order": order,
                            "workload": workload,
                            "trace_mode": "append",
                            "rate": rate,
                            "mode": mode,
                            "policy": "fcfs" if mode.startswith("stream") else "default",
                            "repeat": repeat,
                            "engine": 0,
                            "sched": {"preemptions_recompute": 2, "preemptions_swap": 0}
                            if mode.startswith("stream")
                            else None,
                            "records": records(mode, workload, rate, mode == "sessions"),
                            "probe_s": probe,
                            "replay_wall_s": 30.0,
                            "bound_samples": 4,
                        }
                    )
                    order += 1
    # bounds: 0.5 s (the minimum of 3 samples), except q0's 1.5 s: a fault for the 1 s modes
    samples = {w: {f"q{i}": [0.6, 0.5, 0.7] if i else [1.5] for i in range(N)}
               for w in ("crawler", "ann")}  # fmt: skip
    lower = {"method": "measured", "repeats": 3, "samples_s": {"0": samples}}
    summarize_runs(runs, lower, margin=0.25)
    regime = PaperRegime()
    cal = calibrate(regime, {"crawler": [1.0], "ann": [2.0]}, 1000.0, {"crawler": 1000.0,
                    "ann": 1000.0})  # fmt: skip
    cal.update(probe_tokens=1000, probe_s=1.0)
    cal["rows"] = paper_rows_for(cal, regime.rows)
    for run in runs:  # rate 0.5 plays the paper's mapped rate (crawler 1 QPS, ann 2 QPS)
        if run["rate"] == 0.5:
            run["rate"] = cal["rates"][run["workload"]][0]["local_qps"]
    return {
        "preset": "unit",
        "description": "a synthetic result",
        "command": "s2l bench --preset unit",
        "date": "2026-01-01 00:00 UTC",
        "wall_s": 12.0,
        "machine": {"nproc": 2, "cpu_model": "Test CPU", "load_start": "1.0", "load_end": "2.0"},
        "config": {
            "model": "tiny",
            "engine_kwargs": {"dtype": "bfloat16"},
            "target": "engine",
            "workloads": [{"name": "crawler", "queries": N, "rates": [0.5, 1.0]}],
            "seed": 0,
            "max_context_tokens": 1000,
            "delay_scale": 1.0,
            "max_new_tokens": 1,
        },
        "engines": [
            {
                "policy": "default",
                "start_s": 40.0,
                "stream_config": {"speculative_chunk": 256, "hold_back": True},
            }
        ],
        "interleave": {"method": "one engine", "seed": 0, "repeats": 2},
        "probe": {
            "tokens": 1000,
            "median_s": 1.0,
            "prefill_tok_s": 1000.0,
            "margin": 0.25,
            "flagged": sum(r["drift"]["flagged"] for r in runs),
        },  # fmt: skip
        "lower_bound": lower,
        "bound_faults": sum(r["bound_faults"] for r in runs),
        "paper_regime": cal,
        "sched_note": "scheduler counters",
        "runs": runs,
        "comparisons": comparisons(runs, seed=0, local_tok_s=1000.0, lower_bound=lower),
    }


@pytest.fixture(scope="module")
def result() -> dict:
    return make_result()


def test_each_replay_is_compared_with_the_wait_replay_of_its_repeat(result):
    stream = next(r for r in result["runs"] if r["mode"] == "stream-fcfs" and r["repeat"] == 1)
    assert stream["vs_wait"]["ttft_speedup"]["p50"] == pytest.approx(2.0)
    assert len(stream["queries"]) == N and "records" not in stream
    assert stream["bound_faults"] == 1  # q0: 1.0 s under 0.95 x its 1.5 s bound
    assert stream["summary"]["ttft_over_bound"]["n"] == N - 1  # left out of the ratios
    assert stream["summary"]["ttft_over_bound"]["p50"] == pytest.approx(2 * (1 + 6 / N))
    wait = next(r for r in result["runs"] if r["mode"] == "wait")
    assert wait["bound_faults"] == 0
    flagged = [r for r in result["runs"] if r["drift"]["flagged"]]
    assert len(flagged) == 2 and all(r["probe_s"] == 2.0 for r in flagged)


def test_comparisons_pool_repeats_and_carry_intervals(result):
    by = {(c["workload"], c["rate"], c["mode"]): c for c in result["comparisons"]}
    c = by[("crawler", 1.0, "stream-fcfs")]
    assert c["repeats"] == 2 and c["ttft_s"]["n"] == 2 * N
    sp = c["speedup"]
    assert sp["p50"]["value"] == pytest.approx(2.0) and sp["p50"]["lo"] == pytest.approx(2.0)
    assert sp["p95"]["value"] == pytest.approx(2.0) and sp["p99"]["insufficient"] == "n<100"
    assert c["ttft_s"]["p99"] is None and c["ttft_s"]["p95"] is not None
    assert c["utilization"] == pytest.approx(1.0)  # 1 QPS x 1,000 tokens / 1,000 tokens/s
    assert c["preemptions"] == {"recompute": 4, "swap": 0}
    sessions = by[("crawler", 1.0, "sessions")]
    assert sessions["failed"] == 2 and math.isinf(sessions["ttft_s"]["p95"])
    assert by[("ann", 1.0, "sessions")]["drift_flagged"] == 1


def test_stream_modes_are_compared_with_sglangs_peers_that_ran_beside_them(result):
    by = {(c["workload"], c["rate"], c["mode"]): c for c in result["comparisons"]}
    peers = by[("crawler", 1.0, "stream-fcfs")]["vs_peers"]
    assert list(peers) == ["sessions"]  # no warming replay in this result
    assert peers["sessions"]["p50"]["value"] == pytest.approx(1.0)  # same TTFTs
    assert peers["sessions"]["p95"]["value"] == math.inf  # sessions' p95 is a failed query
    assert peers["sessions"]["p99"]["insufficient"] == "n<100"
    assert "vs_peers" not in by[("crawler", 1.0, "wait")]
    assert "vs_peers" not in by[("crawler", 1.0, "sessions")]
    md = markdown(result, figures=False).split("## crawler (append mode), 1 QPS")[1]
    assert "| mode | over `sessions` p50 | over `sessions` p95 | over `sessions` p99 |" in md
    assert "| `stream-fcfs` | 1.00x [1.00, 1.00] | inf | n<100 |" in md


def test_queries_of_one_chunk_are_compared_with_waiting_on_their_own(result):
    """The half of the queries whose context came in one chunk get their own speedup over
    waiting (stream-fcfs and sessions take half waiting's TTFT on every query)."""
    by = {(c["workload"], c["rate"], c["mode"]): c for c in result["comparisons"]}
    one = by[("ann", 1.0, "stream-fcfs")]["one_chunk"]
    assert one["queries"] == N // 2
    assert one["p50"]["value"] == pytest.approx(2.0) and one["p50"]["n"] == N  # 2 repeats
    assert one["p95"]["insufficient"] == "n<20"  # 12 samples
    assert "one_chunk" not in by[("ann", 1.0, "wait")]
    # sessions' failed query has three chunks: the queries of one chunk all answered
    assert by[("ann", 1.0, "sessions")]["one_chunk"]["p50"]["value"] == pytest.approx(2.0)
    md = markdown(result, figures=False).split("## ann (append mode), 1 QPS")[1]
    assert "Queries whose context came in one chunk" in md
    assert cells(md, "| `stream-fcfs` | 6 |")[2] == "2.00x [2.00, 2.00]"


def test_write_all_writes_json_markdown_and_pngs(tmp_path, result):
    paths = write_all(result, tmp_path)
    assert {p.name for p in paths} == {
        "results.json", "results.md", "ttft_ccdf.png", "ttft_p95_vs_rate.png",
        "speedup_vs_utilization.png",
    }  # fmt: skip
    data = orjson.loads((tmp_path / "results.json").read_bytes())  # strict JSON: no Infinity
    sessions = next(c for c in data["comparisons"] if c["mode"] == "sessions")
    assert sessions["ttft_s"]["p95"] == "inf"
    for png in ("ttft_ccdf.png", "ttft_p95_vs_rate.png", "speedup_vs_utilization.png"):
        blob = (tmp_path / png).read_bytes()
        assert blob.startswith(b"\x89PNG") and len(blob) > 5000


def cells(md: str, start: str) -> list[str]:
    row = next(line for line in md.splitlines() if line.startswith(start))
    return [c.strip() for c in row.strip("|").split("|")]


def test_markdown_tables(tmp_path, result):
    write_all(result, tmp_path, plots=False)
    md = (tmp_path / "results.md").read_text()
    assert "s2l bench --preset unit" in md and "Test CPU" in md and "2026-01-01" in md
    assert "2 of 24 replays flagged" in md and "**16 measurement fault(s)**" in md
    assert "## crawler (append mode), 1 QPS, utilization 1.00" in md
    ann = md.split("## ann (append mode), 1 QPS")[1]
    row = cells(ann, "| `stream-fcfs`")
    assert row[1] == "2" and row[2] == "24/24"
    assert row[5] == "n<100"  # no p99 from 24 samples
    assert row[6] == "2.00x [2.00, 2.00]" and row[8] == "n<100"
    assert row[10] == "2" and row[-1] == "0/2" and row[-2] == "4"  # faults, drift, preemptions
    sessions = cells(ann, "| `sessions`")
    assert sessions[2] == "22/24" and sessions[4] == "fail" and sessions[-1] == "1/2"
    assert cells(ann, "| `wait`")[10] == "0" and cells(ann, "| `wait`")[6] == "baseline"
    assert "Errors: `sessions`: timed out" in ann
    assert "![TTFT CCDF]" not in md  # no figures were written
    # the stream settings in force, device defaults resolved, are in the header
    assert "stream settings speculative_chunk 256, hold_back True" in md


def test_markdown_lists_replays_in_run_order_with_drift_flags(result):
    md = markdown(result, figures=True)
    log = md.split("## Replays in run order")[1]
    orders = [int(line.split("|")[1]) for line in log.splitlines() if line.startswith("| ")
              and line.split("|")[1].strip().isdigit()]  # fmt: skip
    assert orders == list(range(24))
    assert log.count("**flagged**") == 2 and "+100%" in log
    assert "![speedup against utilization](speedup_vs_utilization.png)" in md


def test_markdown_puts_the_papers_rows_beside_ours(result):
    md = markdown(result)
    paper = md.split("## Beside the paper")[1].split("\n## ")[0]
    assert "49,290 tokens/s" in paper and "x49.3" in paper
    crawler = cells(paper, "| crawler | 1 |")
    assert crawler[4] == "P50" and crawler[5] == "4.3x (FCFS)"
    assert crawler[6].startswith("2.00x [") and crawler[7] == "0.47x"
    ann = cells(paper, "| ann | 2 |")
    assert ann[4] == "P95" and ann[6].startswith("2.00x [") and ann[7] == "0.87x"
    assert "| crawler | 4 |" not in paper  # a paper rate this run did not map


def test_formatting():
    assert fmt_s(0.12345) == "0.123" and fmt_s(12.345) == "12.3" and fmt_s("inf") == "fail"
    assert fmt_s(None) == "-" and fmt_x(2.345) == "2.35x" and fmt_x(None) == "-"
    assert fmt_pct({"p95": 1.5, "n": 19}, "p95") == "n<20"
    assert fmt_pct({"p95": 1.5, "n": 20}, "p95") == "1.500"
    assert fmt_speedup({"value": 3.0, "lo": 2.5, "hi": 3.5, "n": 40}) == "3.00x [2.50, 3.50]"
    assert fmt_speedup({"value": None, "n": 5, "insufficient": "n<20"}) == "n<20"


def test_preemptions_are_split_by_mode_when_some_swapped():
    assert _preempted(None) == "n/a"
    assert _preempted({"recompute": 3, "swap": 0}) == "3"
    assert _preempted({"recompute": 1, "swap": 2}) == "3 (1 recompute, 2 swap)"


def test_a_replay_is_compared_with_the_wait_replay_of_its_own_repeat():
    def run(mode: str, repeat: int, ttft: float) -> dict:
        recs = []
        for i in range(4):
            r = QueryRecord(f"q{i}", "w", "append", mode, 1.0, 0.0, 1.0)
            r.first_token_at = r.done_at = 1.0 + ttft
            recs.append(r)
        return {"workload": "w", "trace_mode": "append", "rate": 1.0, "mode": mode,
                "repeat": repeat, "records": recs, "probe_s": 1.0}  # fmt: skip

    runs = [run("wait", 0, 2.0), run("stream-fcfs", 0, 1.0), run("wait", 1, 6.0),
            run("stream-fcfs", 1, 2.0)]  # fmt: skip
    summarize_runs(runs, {}, margin=0.25)
    assert [r["vs_wait"]["ttft_speedup"]["p50"] for r in runs] == [1.0, 2.0, 1.0, 3.0]
    (pooled,) = [c for c in comparisons(runs) if c["mode"] == "stream-fcfs"]
    assert pooled["speedup"]["p50"]["value"] == pytest.approx(4.0 / 1.5)  # pooled medians
