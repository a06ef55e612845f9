"""Test helpers (factories, not fixtures chains)."""

from __future__ import annotations

import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_own_process(module: str, *args: str, timeout: float = 900) -> dict:
    """Run `python -m module args...` from the repository root and return the JSON object on
    its last line of output (the `tests/integration/*_run.py` scenarios, which start and shut
    down their own engines: SGLang's `Engine.shutdown()` kills every child of its process, so
    inside the test session it would take the session's engines and servers with it)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fresh_salt() -> str:
    """A new `cache_salt` (SGLang's prefix-cache namespace): a reference request with it reuses
    no KV, so a stream's KV (published to the radix tree when the stream closes) cannot make a
    plain reference agree with it."""
    return uuid.uuid4().hex


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Streaming context lets the engine prefill chunks while retrieval goes on.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "Update mode replaces the whole context; append mode grows it.",
] * 20


def build_tiny_llama(path: Path, add_bos: bool = False) -> Path:
    """Write a 2-layer random Llama and a byte-level BPE tokenizer trained on CORPUS to `path`.

    `add_bos`: the tokenizer puts `<s>` before every text it encodes with special tokens (as
    Llama-3's does), so a prompt tokenized without them differs from SGLang's tokenization.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    if add_bos:
        bos_id = bpe.token_to_id("<s>")
        bpe.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(path)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


class StreamCalls:
    """HTTP calls on the stream routes as a client makes them: the `stream_token` of each
    stream opened through this object goes with that stream's later calls (X-Stream-Token)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        self.url = url
        self.headers = dict(headers or {})
        self.tokens: dict[str, str] = {}

    def for_stream(self, sid: str | None) -> dict[str, str]:
        """The base headers plus stream `sid`'s token, if it was opened here."""
        token = self.tokens.get(sid) if isinstance(sid, str) else None
        return {**self.headers, "X-Stream-Token": token} if token else dict(self.headers)

    def post(self, route: str, body=None, raw: bytes | None = None, headers=None, **kw):
        """POST a JSON body (or `raw` bytes); `headers` replaces the base headers and token."""
        import orjson
        import requests

        data = raw if raw is not None else orjson.dumps(body)
        sid = body.get("stream_id") if isinstance(body, dict) else None
        hdrs = dict(self.for_stream(sid) if headers is None else headers)
        hdrs.setdefault("Content-Type", "application/json")
        kw.setdefault("timeout", 600)
        resp = requests.post(f"{self.url}{route}", data=data, headers=hdrs, **kw)
        if route == "/stream/open" and resp.status_code == 200:
            answer = resp.json()
            self.tokens[answer["stream_id"]] = answer["stream_token"]
        return resp

    def status(self, sid: str, **kw):
        """GET /stream/{sid} with the stream's token."""
        import requests

        kw.setdefault("timeout", 60)
        return requests.get(f"{self.url}/stream/{sid}", headers=self.for_stream(sid), **kw)
