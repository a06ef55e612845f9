"""Benchmark harness: replay streaming traces at Poisson rates, four ways (`s2l bench`).

Layers, lowest first (a module imports only those above it in this list):

    queries   traces -> `Query` (token budget, scaled timeline, prompt head / chunks / tail)
    arrivals  seeded Poisson start offsets
    record    `QueryRecord` (one query's times and token counts), `Timeline` (the replay clock)
    backends  where requests go: the in-process `StreamEngine` or a running `s2l serve`
    modes     registry: wait, warming, sessions (SGLang's own), stream (ours, per policy)
    replay    one mode x workload x rate; the per-query TTFT lower bound
    metrics   percentiles (failures = +inf), CCDF, per-run summary, comparison with `wait`
    report    results.json, results.md, PNG plots
    presets   registry: cpu-quick, memory-pressure, gpu, gpu-memory-pressure
    runner    engine starts, all replays, the result dict

The command line is `s2l_sglang/cli_bench.py` (`s2l bench`).
"""
