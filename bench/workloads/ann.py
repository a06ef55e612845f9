"""ANN-search workload (update mode): progressive HNSW search over SQuAD, one trace per question.

    python -m bench.workloads.ann --out datasets/ann/traces.jsonl.xz [--seed 0] [--num-queries 200]
        [--max-context-tokens 6000]

Corpus and questions: SQuAD v1.1 dev, shipped in datasets/squad/ (CC BY-SA 4.0; `--squad PATH`
reads another copy). Each question is embedded with all-MiniLM-L6-v2 and searched progressively
in a faiss HNSW index of the 2,067 paragraph embeddings (`bench.workloads.progressive`); every
emitted top-k pool is an update event whose content is the pool's paragraphs in rank order (one
per line), cut to the token budget. The modelled timeline comes from `bench.workloads.latency`;
`t_measured` is the real time of query embedding plus search up to the end of that pool's
window. Writes traces, stats.json (beside the traces) and the statistics block of CARD.md there.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from tqdm import tqdm

from bench.traces import DEFAULT_TEMPLATE, Trace, TraceEvent, write_traces
from bench.workloads import latency
from bench.workloads.progressive import HnswGraph, Window, progressive_search
from bench.workloads.report import write_report
from bench.workloads.squad import (
    DEFAULT_SQUAD,
    encode,
    load_encoder,
    load_squad,
    paragraph_embeddings,
)
from bench.workloads.tokens import TOKENIZERS, load_counter, truncate_to_tokens


def build_index(vectors: np.ndarray, m: int = 16, ef_construction: int = 40) -> faiss.IndexHNSW:
    """A faiss HNSW index (inner product), built on one thread so that it is deterministic."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        index = faiss.IndexHNSWFlat(vectors.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.add(vectors)
    finally:
        faiss.omp_set_num_threads(threads)
    return index


def fit_pools(
    windows: Sequence[Window], doc_tokens: Sequence[int], budget: int
) -> list[tuple[tuple[int, ...], Window]]:
    """Each window's pool cut to the leading documents that fit `budget` tokens; windows whose
    cut pools are equal merge into the first (the later one brought nothing new in budget)."""
    fitted: list[tuple[tuple[int, ...], Window]] = []
    for window in windows:
        counts = [doc_tokens[d] for d in window.pool]
        pool = window.pool[: truncate_to_tokens(list(window.pool), counts, budget)]
        if fitted and fitted[-1][0] == pool:
            first = fitted[-1][1]
            merged = Window(
                pool, first.start_iteration, window.end_iteration, first.t_start, window.t_end
            )
            fitted[-1] = (pool, merged)
        else:
            fitted.append((pool, window))
    return fitted


def make_trace(
    question: Any,
    fitted: list[tuple[tuple[int, ...], Window]],
    paragraphs: Sequence[str],
    times: Sequence[float],
    embed_time: float,
    params: dict[str, Any],
) -> Trace:
    events = tuple(
        TraceEvent(
            t=round(t, 6),
            mode="update",
            content="".join(paragraphs[d] + "\n" for d in pool),
            t_measured=round(embed_time + window.t_end, 6),
        )
        for (pool, window), t in zip(fitted, times, strict=True)
    )
    final_pool = fitted[-1][0]
    meta = {
        "source": "squad-v1.1-dev",
        "squad_id": question.id,
        "title": question.title,
        "answers": list(question.answers),
        "gold_doc": question.gold,
        "gold_in_final_pool": question.gold in final_pool,
        "gold_rank": final_pool.index(question.gold) if question.gold in final_pool else None,
        "pools": [list(pool) for pool, _ in fitted],
        "iterations": [[w.start_iteration, w.end_iteration] for _, w in fitted],
        **params,
    }
    return Trace(
        f"squad-{question.id}", "ann", "update", question.text, DEFAULT_TEMPLATE, events, meta
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("datasets/ann/traces.jsonl.xz"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-queries", type=int, default=200)
    p.add_argument("--max-context-tokens", type=int, default=6000)
    p.add_argument("--top-k", type=int, default=0, help="pool size (0: fill the token budget)")
    p.add_argument("--ef", type=int, default=128, help="candidate list size of the search")
    p.add_argument("--hnsw-m", type=int, default=16)
    p.add_argument("--min-change", type=float, default=0.4, help="share of new docs to emit")
    p.add_argument("--squad", type=Path, default=DEFAULT_SQUAD)
    p.add_argument("--tokenizer", choices=TOKENIZERS, default="smollm2")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    squad = load_squad(args.squad)
    vectors = paragraph_embeddings(squad)
    count = load_counter(args.tokenizer)
    doc_tokens = [count(p + "\n") for p in squad.paragraphs]
    top_k = args.top_k or max(10, math.ceil(args.max_context_tokens / np.mean(doc_tokens)))
    ef = max(args.ef, top_k)
    index = build_index(vectors, args.hnsw_m)
    graph = HnswGraph(index)
    encoder = load_encoder()

    # a seeded permutation's prefix: a smaller --num-queries gives a prefix of the same traces
    picks = np.random.default_rng(args.seed).permutation(len(squad.questions))[: args.num_queries]
    questions = [squad.questions[i] for i in picks]
    params = {"k": top_k, "ef": ef, "hnsw_m": args.hnsw_m, "min_change": args.min_change}

    traces, query_vectors, search_times = [], [], []
    for i, question in enumerate(tqdm(questions, desc="ann queries", unit="q")):
        t0 = time.perf_counter()
        query = encode(encoder, [question.text])[0]
        embed_time = time.perf_counter() - t0
        windows = progressive_search(graph, vectors, query, top_k, ef, args.min_change)
        fitted = fit_pools(windows, doc_tokens, args.max_context_tokens)
        times = latency.ann_timeline(len(fitted), latency.query_rng(args.seed, i))
        traces.append(make_trace(question, fitted, squad.paragraphs, times, embed_time, params))
        query_vectors.append(query)
        search_times.append(windows[-1].t_end)

    write_traces(args.out, traces)
    extra = retrieval_quality(index, vectors, np.stack(query_vectors), questions, traces, ef)
    extra["search_ms_mean"] = 1000 * float(np.mean(search_times))
    extra.update(params)
    summary = write_report(
        "ann", traces, count, args, extra, f"recall(final pool) {extra['recall_final_pool']:.3f}"
    )
    print(f"{summary}, {time.perf_counter() - started:.0f} s")


def retrieval_quality(
    index: faiss.IndexHNSW,
    vectors: np.ndarray,
    queries: np.ndarray,
    questions: Sequence[Any],
    traces: Sequence[Trace],
    ef: int,
) -> dict[str, float]:
    """Recall of the gold paragraph: in our final pools, and for reference in faiss's own HNSW
    search (top 10) and an exact search (top 10)."""
    gold = np.array([q.gold for q in questions])
    index.hnsw.efSearch = ef
    _, found = index.search(queries, 10)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    final = [t.meta["pools"][-1] for t in traces]
    return {
        "recall_final_pool": float(np.mean([g in p for g, p in zip(gold, final, strict=True)])),
        "recall_final_top10": float(
            np.mean([g in p[:10] for g, p in zip(gold, final, strict=True)])
        ),
        "recall_faiss_hnsw_top10": float(
            np.mean([g in f for g, f in zip(gold, found, strict=True)])
        ),
        "recall_exact_top10": float(np.mean([g in e for g, e in zip(gold, exact, strict=True)])),
        "final_pool_size_mean": float(np.mean([len(p) for p in final])),
    }


if __name__ == "__main__":
    main()
