"""`bench.pooled`: configurations pooled over runs, compared through a base mode of the same runs."""

from __future__ import annotations

import json

import pytest

from bench.pooled import compare, main, samples


def result(seed: int, times: dict[str, list[float]], repeats: int = 1) -> dict:
    """A result with one replay per mode and repeat: `times[mode][i]` is query i's TTFT."""
    runs = [
        {"mode": mode, "workload": "crawler", "repeat": r,
         "queries": [{"query": f"q{i}", "ttft": t, "error": None} for i, t in enumerate(ts)]}
        for mode, ts in times.items() for r in range(repeats)
    ]  # fmt: skip
    return {"config": {"seed": seed}, "runs": runs}


def spread(n: int, scale: float) -> list[float]:
    return [scale * (1 + i / n) for i in range(n)]


def test_b_over_a_is_the_ratio_of_speedups_and_the_base_cancels_a_runs_speed():
    n = 60
    # A: the mode as fast as the base. B: on a machine twice as slow (base x2), the mode only
    # x1.5 slower: against its own base it is 1.33x faster, so B / A = 1.33x
    a = [result(0, {"wait": spread(n, 1), "stream": spread(n, 1)}, repeats=2)]
    b = [result(0, {"wait": spread(n, 2), "stream": spread(n, 1.5)}, repeats=2)]
    pa = (samples(a, "wait"), samples(a, "stream"))
    pb = (samples(b, "wait"), samples(b, "stream"))
    r = compare(pa, pb, "p50")
    assert r["queries"] == n and r["n"] == 2 * n
    assert r["a"]["value"] == pytest.approx(1.0)
    assert r["b"]["value"] == pytest.approx(4 / 3)
    assert r["b_over_a"]["value"] == pytest.approx(4 / 3)
    assert r["b_over_a"]["lo"] == pytest.approx(4 / 3) == pytest.approx(r["b_over_a"]["hi"])
    assert "insufficient" not in compare(pa, pb, "p99")  # 120 samples per mode
    one = [result(0, {"wait": spread(n, 1), "stream": spread(n, 1)})]
    short = (samples(one, "wait"), samples(one, "stream"))
    assert compare(short, pb, "p99")["insufficient"] == "n<100"  # A has 60 per mode


def test_runs_of_two_seeds_are_pooled_as_different_queries_and_failures_are_inf():
    one = result(0, {"wait": [1.0, 2.0], "stream": [1.0, 1.0]})
    two = result(1, {"wait": [3.0, 4.0], "stream": [1.0, 1.0]})
    two["runs"][1]["queries"][0]["error"] = "timed out"
    s = samples([one, two], "stream")
    assert sorted(s) == ["0:q0", "0:q1", "1:q0", "1:q1"]
    assert s["1:q0"] == [float("inf")] and s["0:q1"] == [1.0]


def test_one_rate_of_a_run_of_several_is_taken_alone():
    low = result(0, {"wait": [1.0, 2.0]})
    high = result(0, {"wait": [5.0, 6.0]})
    for run in low["runs"]:
        run["rate"] = 1.0
    for run in high["runs"]:
        run["rate"] = 2.0
    both = {"config": {"seed": 0}, "runs": low["runs"] + high["runs"]}
    assert samples([both], "wait", rate=2.0) == {"0:q0": [5.0], "0:q1": [6.0]}
    assert samples([both], "wait")["0:q0"] == [1.0, 5.0]  # no rate: every run of the mode


def test_the_command_prints_each_percentile_and_what_it_left_out(tmp_path, capsys):
    n = 120
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(result(0, {"sessions": spread(n, 1), "stream-fcfs": spread(n, 1)})))
    b = result(0, {"sessions": spread(n, 1), "stream-fcfs": spread(n, 0.5)})
    b["runs"][0]["queries"].append({"query": "extra", "ttft": 1.0, "error": None})
    pb.write_text(json.dumps(b))
    assert main(["--a", str(pa), "--b", str(pb), "--base", "sessions"]) == 0
    out = capsys.readouterr().out
    assert "p99: 1.00x [1.00, 1.00] | 2.00x [2.00, 2.00] | 2.00x [2.00, 2.00]" in out
    assert "120 queries in both" in out and "1 queries left out" in out
    assert main(["--a", str(tmp_path / "missing.json"), "--b", str(pb)]) == 2


def test_replays_of_a_configuration_are_resampled():
    """B's two replays disagree (the mode 2x faster in one, as fast as the base in the other):
    its interval spans both, where A's replays agree and its interval is a point."""
    n = 60
    a = [result(0, {"wait": spread(n, 1), "stream": spread(n, 0.5)}, repeats=2)]
    b = [result(0, {"wait": spread(n, 1), "stream": spread(n, 0.5)}, repeats=2)]
    for run in b[0]["runs"]:
        if run["mode"] == "stream" and run["repeat"] == 1:
            for q in run["queries"]:
                q["ttft"] *= 2
    pa = (samples(a, "wait"), samples(a, "stream"))
    pb = (samples(b, "wait"), samples(b, "stream"))
    r = compare(pa, pb, "p50")
    assert r["a"]["lo"] == pytest.approx(2.0) == pytest.approx(r["a"]["hi"])
    assert r["b"]["lo"] < 1.05 and r["b"]["hi"] > 1.95
