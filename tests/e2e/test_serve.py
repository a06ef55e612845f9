"""`s2l serve` answers SGLang's own /generate on CPU, with the plugin's API key in force."""

from __future__ import annotations

import requests

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def test_serve_answers_generate(server):
    body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 12}}
    resp = requests.post(f"{server.url}/generate", json=body, headers=server.headers, timeout=120)
    assert resp.status_code == 200
    assert "Paris" in resp.json()["text"]
