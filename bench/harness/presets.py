"""Benchmark presets: a registry of frozen configurations (`s2l bench --preset NAME`).

- `cpu-quick`: a smoke run (under 10 minutes on 2 cores): 6 queries per workload, one rate.
  Too few queries for tails: its report prints p50 only.
- `cpu-full`: tails on a CPU: 100 queries per workload at two rates each; about 57 minutes.
- `paper-regime`: the paper's shapes and load on this machine: whole traces (up to 6,000 tokens),
  the timeline stretched by the paper's prefill rate / ours, the paper's rates mapped at equal
  utilization (`bench.harness.paper`); 60-95 minutes, the slower the machine's prefill the
  longer (measured 2026-12-01: 95 min at 572 tokens/s, 69 min at 723).
- `memory-pressure`: a KV pool smaller than what the concurrent streams hold, chunk delays x10.
- `memory-pressure-tails`: the same pool and delays, ANN only, 100 queries: p99 under memory
  pressure (about 25 minutes).
- `gpu`, `gpu-memory-pressure`: an 8B model on one H100/H200.

CPU presets run bfloat16 (`dtype` in `engine_kwargs`): how a model is served, and about 2x faster
than float32 here; float32 only matters where a run checks output identity (`s2l demo`, tests).
Modes and policies of one run are interleaved (`bench.harness.schedule`). Command-line options
override any field (`bench.cli`); `dataclasses.replace` does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.paper import PaperRegime

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKLOAD_FILES = {
    "crawler": "datasets/crawler/traces.jsonl",
    "ann": "datasets/ann/traces.jsonl.xz",
}
ALL_POLICIES = ("default", "fcfs", "lcas", "mcps")
ALL_MODES = ("wait", "warming", "sessions", "stream")
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    rates: tuple[float, ...]  # Poisson arrival rates, QPS (the paper's QPS under `Preset.paper`)
    queries: int | None = None  # traces drawn (seeded); None: all
    file: str | None = None  # a trace file or folder (`bench.tracefiles`); None: the shipped set
    modes: tuple[str, ...] | None = None  # None: the preset's modes

    @property
    def path(self) -> Path:
        return Path(self.file) if self.file else REPO_ROOT / WORKLOAD_FILES[self.name]


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    workloads: tuple[WorkloadSpec, ...]
    policies: tuple[str, ...] = ALL_POLICIES  # of the `stream` mode
    modes: tuple[str, ...] = ALL_MODES
    model_path: str | None = None  # None: the embedded SmolLM2-135M
    max_context_tokens: int | None = None  # context budget per query (None: whole traces)
    delay_scale: float = 1.0  # chunk times x this (memory pressure: 10)
    max_new_tokens: int = 1  # the paper's prefill-only TTFT setting
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # to sgl.Engine
    seed: int = 0
    drain_timeout_s: float = 180.0  # a query not done this long after the last final chunk fails
    lower_bound: bool = True
    bound_repeats: int = 3  # samples per query of the lower bound (its minimum is the bound)
    repeats: int = 1  # replays of every (workload, rate, mode), interleaved
    probe_tokens: int | None = None  # speed probe size (None: max_context_tokens or 1000)
    drift_margin: float = 0.25  # a replay whose probe strays more from the median is flagged
    paper: PaperRegime | None = None  # set: rates are the paper's QPS, mapped at run time
    budget_s: float | None = None  # the wall time the preset is meant to fit (documentation)
    notes: str = ""

    def workload_modes(self, workload: WorkloadSpec) -> tuple[str, ...]:
        return self.modes if workload.modes is None else workload.modes

    @property
    def probe_size(self) -> int:
        return self.probe_tokens or self.max_context_tokens or 1000


_PRESETS: dict[str, Preset] = {}


def register_preset(preset: Preset) -> Preset:
    if preset.name in _PRESETS:
        raise ValueError(f"preset {preset.name!r} is already registered")
    _PRESETS[preset.name] = preset
    return preset


def preset_names() -> list[str]:
    return list(_PRESETS)


def get_preset(name: str) -> Preset:
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {preset_names()}")
    return _PRESETS[name]


# On a CPU with torch-native attention, one batched prefill of several long prompts is slower per
# token than the same prompts in 512-token chunks; every mode runs on the same engine settings.
CPU_ENGINE = {"chunked_prefill_size": 512, "dtype": "bfloat16"}

register_preset(
    Preset(
        name="cpu-quick",
        description="smoke run (too few queries for tails: p50 only): embedded model on a CPU, "
        "both workloads, 6 queries each at 0.5 QPS, contexts cut to 1,000 tokens, chunk delays "
        "x2, policies default and fcfs",
        workloads=(
            WorkloadSpec("crawler", rates=(0.5,), queries=6),
            WorkloadSpec("ann", rates=(0.5,), queries=6),
        ),
        policies=("default", "fcfs"),
        max_context_tokens=1000,
        # The embedded model prefills ~1,100 tokens/s (bfloat16, 2 cores), ~45x slower than the
        # paper's GPU: with the traces' own delays (crawler gaps ~0.7 s) a page's prefill
        # outlasts the gap to the next page and no mode can overlap anything. x2 brings the
        # ratio of prefill time to chunk gaps closer to the paper's setting.
        delay_scale=2.0,
        engine_kwargs={**CPU_ENGINE, "max_total_tokens": 32768},
        drain_timeout_s=90.0,
        budget_s=600.0,
        notes="1 engine start; 9 interleaved replays of 20-30 s; 36 bound samples.",
    )
)

register_preset(
    Preset(
        name="cpu-full",
        description="tails on a CPU: embedded model, 100 queries per workload (crawler at 0.4 "
        "and 0.8 QPS, ANN at 0.3 and 0.5 QPS), contexts cut to 1,000 tokens, chunk delays x2, "
        "policy fcfs; crawler also warming and sessions",
        workloads=(
            # utilization of `wait` ~0.38 and ~0.76 (1,040 prompt tokens, 1,100 tokens/s)
            WorkloadSpec("crawler", rates=(0.4, 0.8), queries=100),
            # ~0.28 and ~0.47; update-mode streams prefill ~1.8x wait's tokens (rollbacks)
            WorkloadSpec("ann", rates=(0.3, 0.5), queries=100, modes=("wait", "stream")),
        ),
        policies=("fcfs",),
        max_context_tokens=1000,
        delay_scale=2.0,
        engine_kwargs={**CPU_ENGINE, "max_total_tokens": 65536},
        drain_timeout_s=120.0,
        budget_s=3600.0,
        notes="About 57 minutes on 2 quiet cores (bench.harness.budget: 12 replays of 2-6 "
        "minutes, 600 bound samples, 1 engine start). ANN leaves out warming, which resends "
        "every refined context and saturates the engine at these rates.",
    )
)

register_preset(
    Preset(
        name="paper-regime",
        description="the paper's regime: whole traces (up to 6,000 tokens), the timeline "
        "stretched by the paper's prefill rate / this machine's, crawler at the paper's 4 QPS "
        "and ANN at 2 QPS mapped at equal server utilization, 20 queries each, wait vs fcfs",
        workloads=(
            WorkloadSpec("crawler", rates=(4.0,), queries=20),
            WorkloadSpec("ann", rates=(2.0,), queries=20),
        ),
        policies=("fcfs",),
        modes=("wait", "stream"),
        max_context_tokens=None,
        engine_kwargs={**CPU_ENGINE, "max_total_tokens": 131072},
        drain_timeout_s=600.0,
        # A bound sample here is nearly a whole prefill (~9 s at 5,600 tokens; for ANN the final
        # context replaces the cached one): 3 per query would add ~20 minutes. --lower-bound.
        lower_bound=False,
        paper=PaperRegime(),
        budget_s=6000.0,
        notes="Paper prefill rate: an estimate (bench.harness.paper: H200 dense BF16 x 40% MFU "
        "x 2 GPUs / 16 GFLOP per token = 49,300 tokens/s); the local rate is the speed probe at "
        "the start, on prompts of the queries' mean length. Rates are the paper's QPS "
        "(every crawler row: --workloads crawler --rates 0.5,1,2,4, about 6 hours). About "
        "95 minutes at ~570 tokens/s and 69 at 723 (2026-12-01, measured; the timeline scales "
        "with the machine's prefill rate): "
        "each replay lasts until its slowest query's stretched collection ends (crawler "
        "~25 min, ANN ~18 min).",
    )
)

register_preset(
    Preset(
        name="memory-pressure",
        description="embedded model on a CPU, KV pool of 3,072 tokens (the 6 concurrent streams "
        "of a workload hold up to 6 x 1,000), chunk delays x10, all four policies",
        workloads=(
            WorkloadSpec("crawler", rates=(0.5,), queries=6),
            WorkloadSpec("ann", rates=(0.5,), queries=6),
        ),
        max_context_tokens=1000,
        delay_scale=10.0,
        engine_kwargs={**CPU_ENGINE, "max_total_tokens": 3072},
        drain_timeout_s=120.0,
        repeats=2,
        budget_s=2400.0,
        notes="1 engine start; 26 interleaved replays (2 repeats) of one to two minutes each "
        "(delays x10).",
    )
)

register_preset(
    Preset(
        name="memory-pressure-tails",
        description="tails under memory pressure: embedded model on a CPU, KV pool of 3,072 "
        "tokens, ANN (update mode) only, 100 queries at 0.5 QPS, contexts cut to 1,000 tokens, "
        "chunk delays x10 (about 20 streams open at once), policies fcfs, lcas and mcps",
        workloads=(WorkloadSpec("ann", rates=(0.5,), queries=100),),
        policies=("fcfs", "lcas", "mcps"),
        modes=("wait", "stream"),
        max_context_tokens=1000,
        delay_scale=10.0,
        engine_kwargs={**CPU_ENGINE, "max_total_tokens": 3072},
        drain_timeout_s=180.0,
        lower_bound=False,
        budget_s=1800.0,
        notes="1 engine start; 4 replays of about 5.5 minutes; no lower bound (it would add 7 "
        "minutes). ANN only, as in cpu-full: warming resends every refined context and "
        "saturates the engine.",
    )
)

register_preset(
    Preset(
        name="gpu",
        description=f"{LLAMA_8B} on one H100/H200: all traces, the paper's rates "
        "(crawler 0.5-4 QPS, ANN 1-2 QPS), all four policies",
        workloads=(
            WorkloadSpec("crawler", rates=(0.5, 1.0, 2.0, 4.0)),
            WorkloadSpec("ann", rates=(1.0, 2.0)),
        ),
        model_path=LLAMA_8B,
        engine_kwargs={"mem_fraction_static": 0.85},
        drain_timeout_s=300.0,
        budget_s=3 * 3600.0,
        notes="Needs the model (Hugging Face access or a local copy: --model-path) and "
        "pip install '.[gpu]'. Contexts are at most 6,000 SmolLM2 tokens (the traces' cap).",
    )
)

register_preset(
    Preset(
        name="gpu-memory-pressure",
        description=f"{LLAMA_8B} on one H100/H200 with a 64k-token KV pool, chunk delays x10, "
        "60 queries per workload, all four policies",
        workloads=(
            WorkloadSpec("crawler", rates=(1.0,), queries=60),
            WorkloadSpec("ann", rates=(2.0,), queries=60),
        ),
        model_path=LLAMA_8B,
        delay_scale=10.0,
        engine_kwargs={"max_total_tokens": 65536},
        drain_timeout_s=300.0,
        budget_s=3600.0,
    )
)
