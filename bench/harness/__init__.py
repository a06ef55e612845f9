"""Benchmark harness: replay streaming traces at Poisson rates, four ways (`s2l bench`).

Layers, lowest first (a module imports only modules above it in this list):

    presets   registry: cpu-quick, memory-pressure, gpu, gpu-memory-pressure (frozen configs)
    queries   traces -> `Query` (token budget, scaled timeline, prompt head / chunks / tail)
    arrivals  seeded Poisson start offsets
    record    `QueryRecord` (one query's times and token counts), `Timeline` (the replay clock)
    backends  where requests go: the in-process `StreamEngine` or a running `s2l serve`
    modes     registry: wait, warming, sessions (SGLang's own), stream (ours, per policy)
    replay    one mode x workload x rate; the per-query TTFT lower bound
    metrics   percentiles (failures = +inf), CCDF, per-run summary, comparison with `wait`
    plots     TTFT CCDF and p95 TTFT against rate (PNG, matplotlib Agg)
    report    results.json, results.md
    machine   CPUs, GPU, load and CPU pressure, versions, commit
    runner    engine starts, all replays, the result dict

The command line is `s2l_sglang/cli_bench.py` (`s2l bench`); results of the committed runs and
how to read them: `bench/results/README.md`.
"""
