"""Run a benchmark: the engine, the queries, the interleaved replays, then the result dict.

All modes and policies run on one engine, interleaved (`schedule.plan_single`), where the
engine can switch its stream policy at run time (`StreamEngine.set_stream_policy`; for a
server `POST /stream/policy`); otherwise each policy gets its own engine start
(`schedule.plan_per_policy`) and the result says so. The paper regime (`Preset.paper`) first
measures this machine's prefill rate, then stretches the queries' timelines and maps the
paper's rates (`paper.calibrate`). Against a running server (`url`) there is one engine.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.aggregate import bounds_of, comparisons, summarize_runs
from bench.harness.backends import Backend, EngineBackend, HttpBackend
from bench.harness.execute import Progress, RunContext, count_work, execute_plan
from bench.harness.machine import load_now, machine_info
from bench.harness.paper import calibrate, paper_name_for, paper_rows_for
from bench.harness.presets import Preset
from bench.harness.queries import Decode, Encode, Query, load_queries, scaled
from bench.harness.replay import speed_probe
from bench.harness.schedule import NEUTRAL_POLICY, EnginePlan, plan_per_policy, plan_single

BOUND_METHOD = (
    "per query, the minimum of {k} samples, each the TTFT of the full prompt sent right after "
    "the prompt before the final chunk was prefilled (max_new_tokens=0, cached), on the same "
    "engine as the replays; the samples are taken just before replays of that query set and "
    "spread over them (a query's samples before different replays when there are at least {k})"
)
SCHED_TODO = "not exported by this engine: no s2l_sched state in SGLang's internal states"
SWITCHED = "one engine; the stream policy switched before each replay (set_stream_policy)"
PER_POLICY = (
    "fallback: the engine cannot switch its stream policy at run time (no set_stream_policy), "
    "so each policy had its own engine start; replays are interleaved per engine"
)


def _start_engine(preset: Preset, policy: str):
    from s2l_sglang.stream.engine import StreamEngine

    kwargs = dict(preset.engine_kwargs)
    if preset.model_path:
        kwargs["model_path"] = preset.model_path
    kwargs.setdefault("log_level", "error")
    t0 = time.perf_counter()
    # No idle timeout: stretched delays leave a stream quiet for minutes.
    engine = StreamEngine(idle_timeout=None, stream_policy=policy, **kwargs)
    engine.generate("warm up", {"max_new_tokens": 1})
    return engine, time.perf_counter() - t0


def _engine_entry(policy: str, started: float, engine) -> dict:
    """An engine start as results record it: its policy, start time and stream settings (the
    device-dependent defaults resolved, e.g. `speculative_chunk`)."""
    entry = {"policy": policy, "start_s": started}
    config = getattr(engine, "config", None)
    if config is not None:
        entry["stream_config"] = config.as_dict()
    return entry


def _engine_can_switch() -> bool:
    from s2l_sglang.stream.engine import StreamEngine

    return hasattr(StreamEngine, "set_stream_policy")


def build_queries(preset: Preset, encode, decode) -> dict[str, list[Query]]:
    """Each workload's queries; a workload whose traces mix append and update is an error."""
    out = {}
    for wl in preset.workloads:
        qs = load_queries(
            wl.path, wl.queries, preset.seed, preset.max_context_tokens, encode, decode,
            preset.delay_scale,
        )  # fmt: skip
        if not qs:
            raise ValueError(f"{wl.path}: no traces")
        if len({q.mode for q in qs}) > 1:
            raise ValueError(f"{wl.path}: traces mix append and update modes; split the file")
        out[wl.name] = qs
    return out


def calibrate_paper(
    preset: Preset, backend: Backend, queries: dict[str, list[Query]], log: Callable[[str], None]
) -> tuple[Preset, dict[str, list[Query]], dict]:
    """Measure the local prefill rate on prompts of the queries' mean length (the fastest of
    three probes after a discarded one: the first prefills of a new length are slow), then
    stretch the timelines and map the paper's rates at equal utilization."""
    assert preset.paper is not None
    tokens = {w: float(np.mean([len(backend.encode(q.final_prompt)) for q in qs]))
              for w, qs in queries.items()}  # fmt: skip
    probe_tokens = round(float(np.mean([t for t in tokens.values()])))
    probes = [backend.run(speed_probe(backend, probe_tokens)) for _ in range(4)][1:]
    probe_s = min(probes)
    local = probe_tokens / probe_s
    names = {w: paper_name_for(w, qs[0].mode, preset.paper.tokens) for w, qs in queries.items()}
    paper_rates = {w.name: w.rates for w in preset.workloads}
    cal = calibrate(preset.paper, paper_rates, local, tokens, names)
    cal["probe_tokens"], cal["probe_s"], cal["probes_s"] = probe_tokens, probe_s, probes
    cal["rows"] = paper_rows_for(cal, preset.paper.rows)
    scale = cal["delay_scale"]
    log(f"paper regime: local prefill {local:.0f} tokens/s on {probe_tokens}-token prompts, "
        f"timeline x{scale:.1f}")  # fmt: skip
    workloads = tuple(
        replace(w, rates=tuple(r["local_qps"] for r in cal["rates"][w.name]))
        for w in preset.workloads
    )
    preset = replace(
        preset,
        workloads=workloads,
        delay_scale=preset.delay_scale * scale,
        probe_tokens=probe_tokens,
    )
    return preset, {w: [scaled(q, scale) for q in qs] for w, qs in queries.items()}, cal


def _write_checkpoint(path: Path, run: dict) -> None:
    import orjson

    line = {k: v for k, v in run.items() if k != "records"}
    line["records"] = [r.as_dict() for r in run["records"]]
    with path.open("ab") as f:
        f.write(orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


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
    """Run `preset` against an in-process engine (default), a given `StreamEngine` (`engine`,
    not shut down here) or the server at `url`. `checkpoint`: a JSON-lines file that gets each
    replay's raw records as soon as it is done (SGLang takes the whole process down when an
    engine process dies)."""
    t_start = time.perf_counter()
    machine = machine_info()
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    params = {"temperature": 0, "max_new_tokens": preset.max_new_tokens, "ignore_eos": True}
    engines: list[dict] = []
    runs: list[dict] = []
    owned, bar, calibration = None, None, None
    backend: Backend | None = None
    try:
        if engine is not None:
            backend = EngineBackend(engine)
            engines.append({"policy": "given", "start_s": 0.0, "given": True})
            switching = backend.can_switch_policy()
        elif url is not None:
            tokenizer = _load_tokenizer(tokenizer_path or preset.model_path or _model_path())
            backend = HttpBackend(url, tokenizer, api_key)
            engines.append({"policy": "server", "start_s": 0.0, "url": url})
            switching = backend.can_switch_policy()
        else:
            switching = _engine_can_switch()
            first = NEUTRAL_POLICY if switching else (preset.policies or (NEUTRAL_POLICY,))[0]
            log(f"starting the engine (stream policy {first}) ...")
            owned, started = _start_engine(preset, first)
            backend = EngineBackend(owned)
            engines.append(_engine_entry(first, started, owned))
        tok = backend.tokenizer
        queries = build_queries(preset, backend.encode, lambda ids, tok=tok: tok.decode(ids))
        if preset.paper is not None:
            preset, queries, calibration = calibrate_paper(preset, backend, queries, log)
        else:  # a discarded probe: the first prefills of a new length are slow (warm-up)
            backend.run(speed_probe(backend, preset.probe_size))
        trace_modes = {w: qs[0].mode for w, qs in queries.items()}
        plans = (plan_single if switching else plan_per_policy)(preset, trace_modes)
        if not switching and len(plans) > 1 and owned is None:
            if engine is not None:
                raise ValueError("this engine serves one stream policy: choose one policy")
            plans = plans[:1]  # a server without /stream/policy: the policy it was started with
        bar = Progress(count_work(preset, plans, queries), progress)
        ctx = RunContext(preset, queries, params, bar, log, switching)
        ctx.publish = _publish_as_started(backend, plans)
        if checkpoint is not None:
            ctx.on_run = partial(_write_checkpoint, checkpoint)
        for i, plan in enumerate(plans):
            if i > 0:
                owned.shutdown()
                log(f"starting the engine (stream policy {plan.policy}) ...")
                owned, started = _start_engine(preset, plan.policy)
                backend = EngineBackend(owned)
                engines.append(_engine_entry(plan.policy, started, owned))
            runs += execute_plan(backend, plan, i, ctx)
    finally:
        if bar is not None:
            bar.close()
        if owned is not None:
            owned.shutdown()
        elif isinstance(backend, HttpBackend):
            backend.close()
    return _result(preset, command, date, t_start, machine, engines, runs, ctx, switching,
                   url, calibration)  # fmt: skip


def _publish_as_started(backend: Backend, plans: list[EnginePlan]) -> bool | None:
    """The engine's `publish_at_close` as started, if a replay's mode switches it (None if
    none does); a ValueError if the engine cannot switch it."""
    modes = {r.mode.label for p in plans for r in p.replays if r.mode.publish_at_close is not None}
    if not modes:
        return None
    if not backend.can_switch_publish():
        raise ValueError(
            f"modes {sorted(modes)} switch publish_at_close at run time: run them in process "
            "(without --url)"
        )
    counters = backend.run(backend.sched_counters()) or {}
    if "publish_at_close" not in counters:
        raise ValueError("the engine does not report publish_at_close")
    return bool(counters["publish_at_close"])


def _result(preset, command, date, t_start, machine, engines, runs, ctx, switching, url, cal):
    lower = {
        "method": BOUND_METHOD.format(k=preset.bound_repeats) if preset.lower_bound else "off",
        "repeats": preset.bound_repeats,
        "samples_s": ctx.samples,
    }
    lower["ttft_s"] = {w: bounds_of(lower, 0, w) for w in ctx.queries}
    summarize_runs(runs, lower, preset.drift_margin)
    probes = [r["probe_s"] for r in runs if r.get("probe_s") not in (None, float("inf"))]
    median = float(np.median(probes)) if probes else None
    local_tok_s = preset.probe_size / median if median else None
    machine["load_end"] = load_now()
    config = asdict(preset)
    config.update(
        model=preset.model_path or "SmolLM2-135M-Instruct (embedded, s2l model prepare)",
        target="engine" if url is None else url,
        workloads=[
            {"name": w.name, "queries": len(ctx.queries[w.name]), "rates": w.rates,
             "file": str(w.path)}
            for w in preset.workloads
        ],
    )  # fmt: skip
    sched_seen = any(r["sched"] is not None for r in runs)
    return {
        "preset": preset.name,
        "description": preset.description,
        "command": command,
        "date": date,
        "wall_s": time.perf_counter() - t_start,
        "machine": machine,
        "config": config,
        "engines": engines,
        "interleave": {
            "policy_switching": switching,
            "method": SWITCHED if switching else PER_POLICY,
            "seed": preset.seed,
            "repeats": preset.repeats,
        },
        "probe": {
            "tokens": preset.probe_size,
            "median_s": median,
            "prefill_tok_s": local_tok_s,
            "margin": preset.drift_margin,
            "flagged": sum(bool(r["drift"]["flagged"]) for r in runs),
        },
        "lower_bound": lower,
        "bound_faults": sum(r.get("bound_faults", 0) for r in runs),
        "paper_regime": cal,
        "sched_note": "scheduler counters (s2l_sched), per replay" if sched_seen else SCHED_TODO,
        "runs": runs,
        "comparisons": comparisons(runs, preset.seed, local_tok_s, lower),
    }


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _model_path() -> str:
    from s2l_sglang import model

    return str(model.prepare())


def codec(model_path: str | None = None) -> tuple[Encode, Decode]:
    """(encode, decode) of the model's tokenizer (None: the embedded model), encoding as the
    replay backends do (no special tokens), for tools that rebuild a run's queries offline."""
    tok = _load_tokenizer(model_path or _model_path())

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    return encode, tok.decode
