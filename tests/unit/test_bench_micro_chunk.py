"""The per-chunk cost benchmark's pure parts: measured points, the summary at context lengths,
the source text, the plot (the engine part runs in tests/integration/test_bench_smoke.py)."""

from __future__ import annotations

import pytest

from bench.harness.plots import plot_chunk_cost
from bench.micro_chunk import at_lengths, chunk_points, source_ids, summary_line


def test_points_every_chunk_or_every_kth():
    assert chunk_points(64) == [16, 32, 48, 64]
    assert chunk_points(100, chunk=16, every=2) == [32, 64, 96]
    assert chunk_points(10) == []
    with pytest.raises(ValueError):
        chunk_points(64, every=0)


def curve(slope_ms: float) -> list[dict]:
    return [
        {"context_tokens": n, "ack_s": (1 + slope_ms * n / 1000) / 1e3, "call_s": n * 1e-7}
        for n in chunk_points(4096)
    ]


def test_summary_takes_the_median_near_each_length():
    pts = curve(2.0)
    got = at_lengths(pts, [1000, 4000, 8000])
    assert got["1000"] == pytest.approx(3e-3, rel=0.02) and got["4000"] == pytest.approx(
        9e-3, rel=0.05
    )
    assert got["8000"] is None  # no point within 10% of 8,000 tokens
    assert at_lengths(pts, [2000], "call_s")["2000"] == pytest.approx(2e-4, rel=0.02)


def test_summary_line_and_plot(tmp_path):
    data = {
        "chunk_tokens": 16,
        "model": "m",
        "dtype": "bfloat16",
        "wall_s": 12.0,
        "methods": {"stream": curve(1.0), "warming": curve(4.0)},
    }
    data["summary"] = {m: at_lengths(c, [1000, 4000]) for m, c in data["methods"].items()}
    data["append_call_s"] = at_lengths(data["methods"]["stream"], [1000, 4000], "call_s")
    line = summary_line(data, tmp_path)
    assert "at 1000/4000 tokens (ms): stream 2.0/4.8, warming 5.0/16.4" in line
    assert "append() call 0.1/0.4 ms" in line
    plot_chunk_cost(data, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


def test_source_text_is_real_and_long_enough():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    ids = source_ids(Tok(), 30000)
    assert len(ids) == 30000 and len(set(ids)) > 40
