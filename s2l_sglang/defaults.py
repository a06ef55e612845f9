"""Default SGLang settings for the embedded model on a CPU host (torch-native attention).

One table serves the in-process engine (`engine_kwargs`) and the HTTP server (`server_argv`),
so `s2l serve`, `s2l demo` and the tests start SGLang the same way.
"""

from __future__ import annotations

from typing import Any

from s2l_sglang import model

# float32 by default on CPU: the embedded model is small, and in float32 a streamed prefill
# gives output token-identical to a one-shot prefill (bfloat16 reduction order drifts).
CPU_DEFAULTS: dict[str, Any] = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "disable_cuda_graph": True,
    "disable_overlap_schedule": True,
    "dtype": "float32",
    "mem_fraction_static": 0.3,
    # An idle SGLang scheduler otherwise polls in a busy loop and pins a core: on a small CPU
    # host that halves the speed of everything else (other engines, the client, the tests).
    "sleep_on_idle": True,
    # SGLang's CPU default is 4096. A request's prefill runs chunk by chunk, and an abort (or a
    # request that arrives) waits for the chunk in progress: 10-12 s at 4096 for a 5.7k-token
    # prompt on 2 cores, 1.3-1.4 s at 1024 (float32). A cold 5.7k-token prefill took as long at
    # 1024 as at 4096 (bfloat16, median of 4: 17.6 s vs 17.9 s); at 512, 19.7 s
    # (docs/robustness.md). The benchmark presets set 512 themselves.
    "chunked_prefill_size": 1024,
}


# Streams are SGLang streaming sessions: the server must have them enabled.
STREAM_DEFAULTS: dict[str, Any] = {"enable_streaming_session": True}


def is_cpu_host() -> bool:
    import torch

    return not torch.cuda.is_available()


def engine_kwargs(**overrides: Any) -> dict[str, Any]:
    """Keyword arguments for `sglang.Engine`: the embedded model and, on a CPU host, CPU settings."""
    kwargs: dict[str, Any] = {}
    if "model_path" not in overrides:
        kwargs["model_path"] = str(model.prepare())
    kwargs.update(STREAM_DEFAULTS)
    if is_cpu_host():
        kwargs.update(CPU_DEFAULTS)
    kwargs.update(overrides)
    return kwargs


def server_argv(user_argv: list[str]) -> list[str]:
    """`sglang.launch_server` arguments: the user's, plus each default the user did not set."""
    given = {a.split("=", 1)[0].replace("_", "-") for a in user_argv if a.startswith("--")}
    defaults: dict[str, Any] = {}
    if "--model-path" not in given and "--model" not in given:
        defaults["model_path"] = str(model.prepare())
    defaults.update(STREAM_DEFAULTS)
    if is_cpu_host():
        defaults.update(CPU_DEFAULTS)
    argv: list[str] = []
    for key, value in defaults.items():
        flag = "--" + key.replace("_", "-")
        if flag in given:
            continue
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv + user_argv
