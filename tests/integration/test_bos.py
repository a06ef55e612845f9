"""A stream's final prompt is SGLang's own tokenization of the text, BOS included.

SmolLM2 (the embedded model) adds no BOS, so the other equality tests cannot see a missing one;
here the tokenizer adds `<s>` (built at test time), the engine is real (float32 CPU), and the
stream's prompt length and greedy output must equal a plain `/generate`-style request for the
same text, in append and in update mode. Runs `bos_run.py` in its own process (see there why).
"""

from __future__ import annotations

import pytest

from tests.helpers import build_tiny_llama, run_own_process

pytestmark = pytest.mark.engine


def test_stream_prompts_keep_the_bos_that_sglang_adds(tmp_path):
    model_dir = build_tiny_llama(tmp_path / "tiny-bos", add_bos=True)
    result = run_own_process("tests.integration.bos_run", str(model_dir), timeout=600)
    assert result["bos_id"] is not None
    for case, r in result["cases"].items():
        # SGLang's tokenization has the BOS: one token more than the text's own tokens
        assert r["plain_prompt_tokens"] == r["ids_without_special"] + 1, case
        assert r["stream_prompt_tokens"] == r["plain_prompt_tokens"], case
        assert r["stream_ids"] == r["plain_ids"], case
