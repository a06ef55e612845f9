"""BM25 (bm25s, English stopwords, no stemming) for the crawler: the search step over the whole
site, and the per-page filter that keeps the passages relevant to the question.

The filter works like crawl4ai's BM25ContentFilter: the fetched page's passages form their own
BM25 corpus, scored against the question. A page is accepted when its best passage reaches the
page threshold; its passages reaching the (lower) passage threshold are kept, best first up to a
token cap, and returned in document order.
"""

from __future__ import annotations

from collections.abc import Sequence

import bm25s
import numpy as np

from bench.workloads.tokens import Counter


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


class SiteSearch:
    """The search step: BM25 over whole pages, returning the best page ids for a question."""

    def __init__(self, ids: Sequence[str], texts: Sequence[str]) -> None:
        self.ids = list(ids)
        self._bm25 = bm25s.BM25()
        self._bm25.index(tokenize(texts), show_progress=False)

    def search(self, question: str, k: int) -> list[tuple[str, float]]:
        scores = self._bm25.get_scores(tokenize([question])[0])
        order = np.argsort(-scores, kind="stable")[:k]
        return [(self.ids[i], float(scores[i])) for i in order if scores[i] > 0]


def filter_passages(
    question: str,
    passages: Sequence[str],
    page_threshold: float,
    passage_threshold: float,
    max_tokens: int | None = None,
    count_tokens: Counter | None = None,
) -> list[int]:
    """Indices (in document order) of the passages kept for `question`: none unless the best
    passage scores at least `page_threshold`; else those scoring at least `passage_threshold`,
    best first up to `max_tokens` (counted with `count_tokens`)."""
    tokens = tokenize(passages)
    query = tokenize([question])[0]
    if not query or not any(tokens):
        return []
    bm25 = bm25s.BM25()
    bm25.index(tokens, show_progress=False)
    scores = bm25.get_scores(query)
    if scores.max() < page_threshold:
        return []
    ranked = [int(i) for i in np.argsort(-scores, kind="stable") if scores[i] >= passage_threshold]
    if max_tokens is not None and count_tokens is not None:
        kept, total = [], 0
        for i in ranked:
            n = count_tokens(passages[i] + "\n")
            if total + n <= max_tokens:
                kept.append(i)
                total += n
        ranked = kept
    return sorted(ranked)
