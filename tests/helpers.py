"""Test helpers (factories, not fixtures chains)."""

from __future__ import annotations

from pathlib import Path

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
