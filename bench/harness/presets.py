"""Benchmark presets: a registry of frozen configurations (`s2l bench --preset NAME`).

- `cpu-quick`: the embedded model on a CPU, both workloads, 6 queries each, contexts cut to
  1,000 tokens, chunk delays x2, one rate, policies `default` and `fcfs`; meant to fit in 10
  minutes on 2 quiet cores, engine starts included.
- `memory-pressure`: the embedded model on a CPU with a KV pool smaller than what the
  concurrent streams hold, chunk delays x10 (as the paper's memory-pressure runs), all four
  policies: does naive streaming (SGLang sessions: pinned KV) fall behind non-streaming at P99,
  and do our streams, whose idle KV the scheduler preempts under pressure, recover?
- `gpu`: an 8B model on one H100/H200, the whole trace sets, the paper's rates, all policies.
- `gpu-memory-pressure`: the 8B model with a small KV pool and chunk delays x10.

Command-line options override any field (`cli_bench`); `dataclasses.replace` does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    rates: tuple[float, ...]  # Poisson arrival rates, queries per second
    queries: int | None = None  # traces drawn (seeded); None: all

    @property
    def path(self) -> Path:
        return REPO_ROOT / WORKLOAD_FILES[self.name]


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    workloads: tuple[WorkloadSpec, ...]
    policies: tuple[str, ...] = ALL_POLICIES  # one engine start each (stream mode)
    modes: tuple[str, ...] = ALL_MODES
    model_path: str | None = None  # None: the embedded SmolLM2-135M
    max_context_tokens: int | None = None  # context budget per query (None: whole traces)
    delay_scale: float = 1.0  # chunk times x this (memory pressure: 10)
    max_new_tokens: int = 1  # the paper's prefill-only TTFT setting
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # to sgl.Engine
    seed: int = 0
    drain_timeout_s: float = 180.0  # a query not done this long after the last final chunk fails
    lower_bound: bool = True
    budget_s: float | None = None  # the wall time the preset is meant to fit (documentation)
    notes: str = ""


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
CPU_ENGINE = {"chunked_prefill_size": 512}

register_preset(
    Preset(
        name="cpu-quick",
        description="embedded model on a CPU: both workloads, 6 queries each at 0.3 QPS, "
        "contexts cut to 1,000 tokens, chunk delays x2, policies default and fcfs",
        workloads=(
            WorkloadSpec("crawler", rates=(0.3,), queries=6),
            WorkloadSpec("ann", rates=(0.3,), queries=6),
        ),
        policies=("default", "fcfs"),
        max_context_tokens=1000,
        # The embedded model prefills ~500-1,000 tokens/s on 2 cores, ~50x slower than the
        # paper's GPU: with the traces' own delays (crawler gaps ~0.7 s) a page's prefill
        # outlasts the gap to the next page and no mode can overlap anything. x2 brings the
        # ratio of prefill time to chunk gaps closer to the paper's setting.
        delay_scale=2.0,
        engine_kwargs={**CPU_ENGINE, "max_total_tokens": 32768},
        drain_timeout_s=90.0,
        budget_s=600.0,
        notes="2 engine starts, 12 lower-bound measurements, 9 replays of 30-50 s each.",
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
        budget_s=2400.0,
        notes="4 engine starts; replays last about two minutes each (delays x10).",
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
