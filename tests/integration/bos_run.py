"""Streams on a model whose tokenizer adds a BOS, run as its own process by test_bos.py.

The model is the tests' tiny random Llama with a tokenizer that puts `<s>` first (as Llama-3's
puts `<|begin_of_text|>`); the session's engine serves SmolLM2, which adds none, and one
in-process engine per process is the rule (`Engine.shutdown` kills its process's children).

Usage: python -m tests.integration.bos_run MODEL_DIR   (prints one JSON line)
"""

from __future__ import annotations

import json
import os
import sys

from tests.helpers import CORPUS, fresh_salt

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def run(model_dir: str) -> dict:
    from s2l_sglang.stream.engine import StreamEngine

    eng = StreamEngine(model_path=model_dir, idle_timeout=None, log_level="error")
    first, second, question = " ".join(CORPUS[:3]), " " + " ".join(CORPUS[3:6]), " The fox"
    refined = " ".join(CORPUS[1:5])
    out: dict = {"bos_id": eng.tokenizer.bos_token_id, "cases": {}}
    for case, chunks, final in (
        ("append", [("open", first), ("append", second)], first + second + question),
        ("update", [("open", first), ("update", refined)], refined + question),
    ):
        sid = f"bos-{case}"
        for op, text in chunks:
            if op == "open":
                eng.open_stream(sid, GREEDY, text)
            else:
                getattr(eng, op)(sid, text)
        streamed = eng.finish(sid, question)
        # SGLang tokenizes the text; computed afresh (own cache namespace)
        plain = eng.generate(prompt=final, sampling_params=GREEDY, cache_salt=fresh_salt())
        out["cases"][case] = {
            "stream_ids": streamed["output_ids"],
            "plain_ids": plain["output_ids"],
            "stream_prompt_tokens": streamed["meta_info"]["prompt_tokens"],
            "plain_prompt_tokens": plain["meta_info"]["prompt_tokens"],
            "ids_without_special": len(eng.tokenizer.encode(final, add_special_tokens=False)),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])), flush=True)
    os._exit(0)  # the engine's processes go with this one
