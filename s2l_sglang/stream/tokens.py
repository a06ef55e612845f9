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
