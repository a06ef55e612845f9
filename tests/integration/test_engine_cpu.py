"""The real SGLang engine on CPU with the embedded model and the plugin."""

from __future__ import annotations


def test_embedded_model_answers_capital_of_france(engine):
    tok = engine.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 16})
    assert "Paris" in out["text"]
