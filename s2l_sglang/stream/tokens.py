"""Token-exact turns: the prompt a stream ends with is exactly the tokenization of its final text.

Each time the context changes, the whole text is re-tokenized and compared with the tokens the
engine already holds. Appending text can change the last tokens (a word split differently at
the old chunk boundary), so an append is, at token level, a small update: keep the longest common
prefix (LCP), recompute the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: contexts are long and mostly shared.
    block = 256
    while i + block <= n and a[i : i + block] == b[i : i + block]:
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Turn(NamedTuple):
    """What one engine turn sends: keep `keep` held tokens, then prefill `delta`."""

    keep: int  # held tokens to keep (page-aligned); the rest of the held tokens is invalidated
    delta: list[int]  # new tokens, so that held[:keep] + delta == the new token ids
    rollback: bool  # True when keep < len(held): the turn invalidates held KV


def next_turn(
    held: Sequence[int], new: Sequence[int], page_size: int = 1, need_input: bool = False
) -> Turn | None:
    """Plan the turn that takes the engine from `held` tokens to `new` tokens.

    Returns None when there is nothing to send (`new == held`, unless `need_input`). Every turn
    carries at least one token (SGLang recomputes the last prompt token of a turn anyway), so a
    context cut back to a prefix of what is held recomputes its last token; the final turn
    (`need_input`) always does.
    """
    keep = lcp(held, new)
    if keep == len(held) == len(new) and not need_input:
        return None
    keep = min(keep, len(new) - 1)
    if page_size > 1:
        keep -= keep % page_size
    return Turn(keep, list(new[keep:]), keep < len(held))


#: tokens at the end of a text stream's context that are re-tokenized with every appended chunk
#: (a chunk can change how the text before it splits; 16 tokens is far more than any merge
#: across a chunk boundary reaches)
RETOKENIZE_TAIL = 16


class Anchor(NamedTuple):
    """`ids[:tokens]` of a text stream's context are the tokenization of `text[:chars]`; an
    append re-tokenizes only `text[chars:]`."""

    chars: int = 0
    tokens: int = 0


def tokenize_from(tokenizer, text: str, anchor: Anchor, head: Sequence[int], special: bool):
    """Token ids of `text` given that `head` (= ids[:anchor.tokens]) tokenizes
    `text[:anchor.chars]`, and the anchor to use next time: a token boundary
    RETOKENIZE_TAIL tokens before the end. `tokenizer` is a fast (offset-mapping) tokenizer;
    `special`: add special tokens (a BOS), only when the anchor is at the start."""
    enc = tokenizer(
        text[anchor.chars :],
        add_special_tokens=special and anchor.chars == 0,
        return_offsets_mapping=True,
    )
    tail, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    ids = list(head) + tail
    nxt = anchor
    # The last clean boundary at least RETOKENIZE_TAIL tokens from the end: token j starts
    # where token j-1 ended (no byte-split character shared by both) and is not a special token.
    for j in range(len(tail) - RETOKENIZE_TAIL, 0, -1):
        start, prev_end = offsets[j][0], offsets[j - 1][1]
        if start > 0 and start >= prev_end and offsets[j][1] > start:
            nxt = Anchor(anchor.chars + start, anchor.tokens + j)
            break
    return ids, nxt


_PROBE = (
    "Streaming contexts arrive in pieces: naïve re-tokenization costs O(n) per chunk, "
    "whereas tail-only re-tokenization stays flat. Données, 日本語, emoji 🙂 and numbers 12345."
)


def incremental_tokenization_works(tokenizer) -> bool:
    """True if `tokenize_from` gives the whole text's ids for this tokenizer on a sample grown
    7 characters at a time (mid-word cuts). False for a tokenizer without offsets (not fast)
    or one that splits a text's tail differently from the whole (SentencePiece's word-start
    marker): the manager then re-tokenizes whole texts."""
    if not getattr(tokenizer, "is_fast", False):
        return False
    try:
        anchor, ids = Anchor(), []
        for cut in range(7, len(_PROBE) + 7, 7):
            text = _PROBE[:cut]
            ids, anchor = tokenize_from(tokenizer, text, anchor, ids[: anchor.tokens], True)
            if ids != list(tokenizer(text)["input_ids"]):
                return False
    except Exception:  # a tokenizer without offset mappings, say
        return False
    return True
