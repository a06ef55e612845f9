"""Benchmark harness: replay streaming traces at Poisson rates, four ways (`s2l bench`).

Layers, lowest first (a module imports only modules above it in this list):

    paper     the paper's hardware rate (an estimate), workload sizes, headline rows, the
              mapping of its rates onto this machine at equal utilization
    presets   registry: cpu-quick, cpu-full, paper-regime, memory-pressure, gpu, ... (frozen)
    budget    how long a CPU preset takes, estimated before it runs
    stats     samples a percentile needs; paired bootstrap intervals of percentile speedups
    queries   trace files -> `Query` (token budget, scaled timeline, prompt head / chunks / tail)
    arrivals  seeded Poisson start offsets
    record    `QueryRecord` (one query's times and token counts), `Timeline` (the replay clock)
    backends  where requests go: the in-process `StreamEngine` or a running `s2l serve`
    modes     registry: wait, warming, sessions (SGLang's own), stream (ours, per policy)
    replay    one mode x workload x rate; the per-query TTFT lower bound; the speed probe
    metrics   percentiles (failures = +inf), CCDF, per-replay summary, bound faults
    schedule  the run's order: interleaved blocks of replays, one engine or one per policy,
              where the bound samples go, drift flags
    execute   one engine's replays in order (policy switch, probe, bound samples, replay)
    aggregate per-replay comparisons, pooled comparisons with intervals, utilization
    plots     TTFT CCDF, p95 TTFT against rate, speedup against utilization, per-chunk cost
    report    results.json, results.md
    machine   CPUs, GPU, load and CPU pressure, versions, commit
    runner    the engine, the queries, the paper calibration, all replays, the result dict

The command line is `bench/cli.py` (`s2l bench`, `python -m bench.cli`); how to run and read a
benchmark: `bench/README.md`; the committed results: `bench/results/README.md`.
"""
