"""Run a benchmark: engine starts, replays of every workload x rate x mode, then the report.

Modes whose behaviour does not depend on the stream policy (`wait`, `warming`, `sessions`) and
the lower bounds run on the first engine, together with that policy's `stream` mode; each further
policy gets its own engine start (the policy is fixed per scheduler process) and runs `stream`
only. The prefix cache is flushed before every replay. Against a running server (`url`) there is
one "engine": the server, whose policy the caller names.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench.harness.arrivals import arrival_seed, poisson_offsets
from bench.harness.backends import Backend, EngineBackend, HttpBackend
from bench.harness.machine import load_now, machine_info
from bench.harness.metrics import summarize, versus
from bench.harness.modes import Mode, get_mode
from bench.harness.presets import Preset
from bench.harness.queries import Query, load_queries
from bench.harness.replay import lower_bound, replay, speed_probe

BOUND_METHOD = (
    "measured per query on an idle engine before the replays: the prompt before the final "
    "chunk prefilled first (max_new_tokens=0, cached), then the full prompt timed to its first "
    "token (no model: one measurement per query)"
)
SCHED_TODO = (
    "not exported by this build: the scheduler's counters (SchedCounters) live in the "
    "scheduler process; TODO export them through get_internal_state ('s2l_sched')"
)


@dataclass
class EnginePlan:
    """One engine start: its stream policy, the modes replayed on it, whether it measures bounds."""

    policy: str
    modes: list[Mode]
    lower_bound: bool


def plan_engines(preset: Preset) -> list[EnginePlan]:
    """The engine starts a preset needs (at least one)."""
    shared = [m for m in preset.modes if m != "stream"]
    policies = list(preset.policies) or ["default"]
    if "stream" not in preset.modes:
        policies = policies[:1]
    plans = []
    for i, policy in enumerate(policies):
        modes = [get_mode(m, policy) for m in shared] if i == 0 else []
        if "stream" in preset.modes:
            modes.append(get_mode("stream", policy))
        plans.append(EnginePlan(policy, modes, lower_bound=i == 0 and preset.lower_bound))
    return plans


def count_queries(preset: Preset, plans: Sequence[EnginePlan], queries: dict[str, list]) -> int:
    """Query replays (and bound measurements) the whole benchmark makes: the progress total."""
    total = 0
    for plan in plans:
        for wl in preset.workloads:
            qs = queries[wl.name]
            if not qs:
                continue
            total += len(qs) if plan.lower_bound else 0
            modes = [m for m in plan.modes if m.applies_to(qs[0].mode)]
            total += len(qs) * len(wl.rates) * len(modes)
    return total


def _start_engine(preset: Preset, policy: str):
    from s2l_sglang.stream.engine import StreamEngine

    kwargs = dict(preset.engine_kwargs)
    if preset.model_path:
        kwargs["model_path"] = preset.model_path
    kwargs.setdefault("log_level", "error")
    t0 = time.perf_counter()
    # No idle timeout: delays x10 leave a stream quiet for tens of seconds.
    engine = StreamEngine(idle_timeout=None, stream_policy=policy, **kwargs)
    engine.generate("warm up", {"max_new_tokens": 1})
    return engine, time.perf_counter() - t0


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def build_queries(preset: Preset, encode, decode) -> dict[str, list[Query]]:
    return {
        wl.name: load_queries(
            wl.path,
            wl.queries,
            preset.seed,
            preset.max_context_tokens,
            encode,
            decode,
            preset.delay_scale,
        )
        for wl in preset.workloads
    }


def _counter_delta(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    return {
        k: after[k] - before.get(k, 0)
        for k in after
        if isinstance(after[k], int | float) and not isinstance(after[k], bool)
    }


class _Progress:
    def __init__(self, total: int, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="query", disable=not enabled, file=sys.stderr)

    def describe(self, text: str) -> None:
        self.bar.set_description(text, refresh=True)

    def tick(self, *_: Any) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run_engine_plan(
    backend: Backend,
    plan: EnginePlan,
    preset: Preset,
    queries: dict[str, list[Query]],
    params: dict,
    progress: _Progress,
    bounds: dict[str, dict[str, float]],
    log: Callable[[str], None],
    on_run: Callable[[dict], None] | None = None,
) -> list[dict]:
    """All replays on one engine (or server); fills `bounds` if the plan measures them.
    `on_run` sees each run as soon as it is done (a checkpoint)."""
    runs = []
    for wl in preset.workloads:
        qs = queries[wl.name]
        if not qs:
            continue
        if plan.lower_bound:
            progress.describe(f"{wl.name}: lower bounds")
            probe = backend.run(speed_probe(backend, preset.max_context_tokens or 1000))
            bounds.setdefault("probe_s", {})[wl.name] = probe
            if not backend.run(backend.flush()):
                log("warning: cache not flushed before the lower bounds")
            wl_bounds = bounds.setdefault(wl.name, {})
            for q in qs:
                try:
                    wl_bounds[q.id] = backend.run(lower_bound(backend, q, params))
                except Exception as exc:
                    log(f"warning: lower bound of {q.id} failed: {exc}")
                    wl_bounds[q.id] = float("inf")
                progress.tick()
        for rate in wl.rates:
            offsets = poisson_offsets(len(qs), rate, arrival_seed(preset.seed, wl.name, rate))
            for mode in plan.modes:
                if not mode.applies_to(qs[0].mode):
                    continue
                progress.describe(f"{plan.policy} engine: {wl.name} {rate:g} QPS {mode.label}")
                probe = backend.run(speed_probe(backend, preset.max_context_tokens or 1000))
                flushed = backend.run(backend.flush())
                if not flushed:
                    log(f"warning: cache not flushed before {wl.name} {rate:g} {mode.label}")
                before = backend.run(backend.sched_counters())
                t0 = time.perf_counter()
                records = backend.run(
                    replay(
                        backend, mode, qs, offsets, rate, params, preset.drain_timeout_s,
                        progress.tick,
                    )
                )  # fmt: skip
                wall = time.perf_counter() - t0
                after = backend.run(backend.sched_counters())
                runs.append(
                    {
                        "workload": wl.name,
                        "trace_mode": qs[0].mode,
                        "rate": rate,
                        "mode": mode.label,
                        "policy": plan.policy,
                        "flushed_before": flushed,
                        "probe_s": probe,
                        "replay_wall_s": wall,
                        "offsets": [float(x) for x in offsets],
                        "sched": _counter_delta(before, after),
                        "records": records,
                    }
                )
                if on_run is not None:
                    on_run(runs[-1])
    return runs


def _write_checkpoint(path: Path, run: dict) -> None:
    import orjson

    line = {k: v for k, v in run.items() if k != "records"}
    line["records"] = [r.as_dict() for r in run["records"]]
    with path.open("ab") as f:
        f.write(orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def summarize_runs(runs: list[dict], bounds: dict[str, dict[str, float]]) -> None:
    baselines = {}
    for run in runs:
        run["summary"] = summarize(run["records"], bounds.get(run["workload"]))
        if run["mode"] == "wait":
            baselines[(run["workload"], run["rate"])] = run["summary"]
    for run in runs:
        base = baselines.get((run["workload"], run["rate"]))
        run["vs_wait"] = versus(run["summary"], base) if base is not None else None
        run["queries"] = [r.as_dict() for r in run.pop("records")]


def run_bench(
    preset: Preset,
    url: str | None = None,
    api_key: str | None = None,
    tokenizer_path: str | None = None,
    command: str = "",
    progress: bool = True,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    engine: Any = None,
    checkpoint: Path | None = None,
) -> dict:
    """Run `preset` against in-process engines (default) or the server at `url`.

    `engine`: an already started `StreamEngine` to use instead of starting one (the preset must
    then need a single engine, i.e. one policy; it is not shut down here).
    `checkpoint`: a JSON-lines file that gets each replay's raw records as soon as it is done
    (SGLang takes the whole process down when an engine process dies).
    """
    t_start = time.perf_counter()
    machine = machine_info()
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    params = {"temperature": 0, "max_new_tokens": preset.max_new_tokens, "ignore_eos": True}
    plans = plan_engines(preset)
    if url is not None:
        plans = plans[:1]  # one server, one policy: the caller names it (the first of `policies`)
    if engine is not None and len(plans) != 1:
        raise ValueError("a given engine serves one stream policy: choose one policy")
    runs: list[dict] = []
    bounds: dict[str, dict[str, float]] = {}
    engines: list[dict] = []
    queries: dict[str, list[Query]] | None = None
    bar: _Progress | None = None
    sched_seen = False
    try:
        for plan in plans:
            owned = None
            if engine is not None:
                backend: Backend = EngineBackend(engine)
                tokenizer = engine.tokenizer
                engines.append({"policy": plan.policy, "start_s": 0.0, "given": True})
            elif url is None:
                log(f"starting the engine (stream policy {plan.policy}) ...")
                owned, started = _start_engine(preset, plan.policy)
                backend = EngineBackend(owned)
                tokenizer = owned.tokenizer
                engines.append({"policy": plan.policy, "start_s": started})
            else:
                tokenizer = _load_tokenizer(tokenizer_path or preset.model_path or _model_path())
                backend = HttpBackend(url, tokenizer, api_key)
                engines.append({"policy": plan.policy, "start_s": 0.0, "url": url})
            try:
                if queries is None:

                    def decode(ids: list[int], tok=tokenizer) -> str:
                        return tok.decode(ids)

                    queries = build_queries(preset, backend.encode, decode)
                    bar = _Progress(count_queries(preset, plans, queries), progress)
                runs += run_engine_plan(
                    backend, plan, preset, queries, params, bar, bounds, log,
                    partial(_write_checkpoint, checkpoint) if checkpoint else None,
                )  # fmt: skip
                sched_seen = sched_seen or any(r["sched"] is not None for r in runs)
            finally:
                if owned is not None:
                    owned.shutdown()
                elif isinstance(backend, HttpBackend):
                    backend.close()
    finally:
        if bar is not None:
            bar.close()
    summarize_runs(runs, bounds)
    machine["load_end"] = load_now()
    config = asdict(preset)
    config.update(
        model=preset.model_path or "SmolLM2-135M-Instruct (embedded, s2l model prepare)",
        target="engine" if url is None else url,
        workloads=[
            {"name": w.name, "queries": len(queries[w.name]) if queries else 0, "rates": w.rates}
            for w in preset.workloads
        ],
    )
    return {
        "preset": preset.name,
        "description": preset.description,
        "command": command,
        "date": date,
        "wall_s": time.perf_counter() - t_start,
        "machine": machine,
        "config": config,
        "engines": engines,
        "lower_bound": {
            "method": BOUND_METHOD,
            "probe_s": bounds.pop("probe_s", {}),
            "ttft_s": bounds,
        },
        "sched_note": "scheduler counters (s2l_sched), per replay" if sched_seen else SCHED_TODO,
        "runs": runs,
    }


def _model_path() -> str:
    from s2l_sglang import model

    return str(model.prepare())
