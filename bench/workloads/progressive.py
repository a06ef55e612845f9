"""Progressive search over a faiss HNSW graph: the top-k pool as the search refines it.

DiskANN-style search with partial results (the paper's ANN workload) exposes its candidate pool
as the beam search iterates. We do the same on the graph faiss built: greedy descent through the
upper HNSW levels, then a best-first beam search on level 0 with a candidate list of `ef`
entries, one node expanded per iteration. The top-k pool is read after every iteration and
at convergence. Like a recall-aware partial result, a pool is emitted only when it differs enough
from the one emitted last (a share of new documents), so each emitted pool opens a window
[start iteration, end iteration) lasting until the next emitted change or the end of the search.
Similarity is the inner product (normalized embeddings: cosine).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Collection
from dataclasses import dataclass

import faiss
import numpy as np


@dataclass(frozen=True)
class Window:
    """One pool, from the iteration it appeared to the iteration it was replaced (or the end)."""

    pool: tuple[int, ...]
    start_iteration: int
    end_iteration: int
    t_start: float  # measured seconds since the search started
    t_end: float


class HnswGraph:
    """Read-only view of the neighbour lists of a faiss `IndexHNSWFlat`."""

    def __init__(self, index: faiss.IndexHNSW) -> None:
        hnsw = index.hnsw
        self.entry_point = int(hnsw.entry_point)
        self.max_level = int(hnsw.max_level)
        self._levels = faiss.vector_to_array(hnsw.levels)
        self._offsets = faiss.vector_to_array(hnsw.offsets)
        self._neighbors = faiss.vector_to_array(hnsw.neighbors)
        self._cum = faiss.vector_to_array(hnsw.cum_nneighbor_per_level)

    def neighbors(self, node: int, level: int) -> np.ndarray:
        if level >= self._levels[node]:
            return np.empty(0, dtype=np.int64)
        base = int(self._offsets[node])
        ids = self._neighbors[base + int(self._cum[level]) : base + int(self._cum[level + 1])]
        return ids[ids >= 0]


def progressive_search(
    graph: HnswGraph,
    vectors: np.ndarray,
    query: np.ndarray,
    k: int,
    ef: int,
    min_change: float = 0.0,
    checkpoints: Collection[int] | None = None,
) -> list[Window]:
    """The successive top-k pools of one query, each ranked by decreasing similarity.

    `vectors` are the indexed (normalized) vectors; `ef >= k` is the candidate list size. The
    pool is read after every iteration (or only at `checkpoints`) and a new window opens when at
    least `min_change * k` of its documents are not in the current window's pool (0: any
    change); the converged pool always closes the search, if it differs at all.
    """
    if ef < k:
        raise ValueError(f"ef ({ef}) must be >= k ({k})")
    start = time.perf_counter()

    def sim(ids: np.ndarray) -> np.ndarray:
        return vectors[ids] @ query

    # Greedy descent through the upper levels.
    node = graph.entry_point
    best = float(sim(np.array([node]))[0])
    for level in range(graph.max_level, 0, -1):
        improved = True
        while improved:
            improved = False
            ids = graph.neighbors(node, level)
            if ids.size:
                sims = sim(ids)
                j = int(np.argmax(sims))
                if sims[j] > best:
                    node, best, improved = int(ids[j]), float(sims[j]), True

    # Best-first beam search on level 0.
    visited = {node}
    candidates = [(-best, node)]  # max-heap of nodes to expand
    results = [(best, node)]  # min-heap of the ef best nodes seen
    windows: list[Window] = []
    iteration = 0

    def read_pool(final: bool) -> None:
        pool = tuple(n for _, n in heapq.nlargest(k, results))
        if windows:
            current = windows[-1].pool
            new = len(set(pool) - set(current))
            if pool == current or (not final and new < min_change * k):
                return
        now = time.perf_counter() - start
        if windows:
            last = windows[-1]
            windows[-1] = Window(last.pool, last.start_iteration, iteration, last.t_start, now)
        windows.append(Window(pool, iteration, iteration, now, now))

    while candidates:
        neg, node = heapq.heappop(candidates)
        if len(results) >= ef and -neg < results[0][0]:
            break  # converged: no candidate left can enter the list
        iteration += 1
        ids = np.array([n for n in graph.neighbors(node, 0).tolist() if n not in visited])
        if ids.size:
            visited.update(ids.tolist())
            for s, n in zip(sim(ids).tolist(), ids.tolist(), strict=True):
                if len(results) < ef or s > results[0][0]:
                    heapq.heappush(candidates, (-s, n))
                    heapq.heappush(results, (s, n))
                    if len(results) > ef:
                        heapq.heappop(results)
        if checkpoints is None or iteration in checkpoints:
            read_pool(final=False)
    read_pool(final=True)
    last = windows[-1]
    end = time.perf_counter() - start
    windows[-1] = Window(last.pool, last.start_iteration, iteration, last.t_start, end)
    return windows
