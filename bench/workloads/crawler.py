"""Crawler workload (append mode): a real async crawl of the Python docs site, one trace per FAQ
question.

    python -m bench.workloads.crawler --out datasets/crawler/traces.jsonl [--seed 0]
        [--num-queries 175] [--max-context-tokens 6000]

Per question: a search step (BM25 over the site's pages) picks seed pages; an aiohttp crawler
fetches them from the site served on 127.0.0.1 and goes breadth-first to depth 2 along the links
of each page's main body; each fetched page is parsed and BM25-filtered against the question
(`bench.workloads.bm25`), and every accepted page is an append event (its title and kept
passages), until the token budget or the page limit is reached. Events are in BFS order;
`t_measured` is the real time since the query started when that page (and every page before it)
had been fetched, parsed and filtered; `t` is the modelled wide-area timeline
(`bench.workloads.latency`). Writes traces, stats.json (beside the traces) and CARD.md's table.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from tqdm import tqdm

from bench.traces import DEFAULT_TEMPLATE, Trace, TraceEvent, write_traces
from bench.workloads import latency
from bench.workloads.bm25 import SiteSearch, filter_passages
from bench.workloads.report import write_report
from bench.workloads.site import Page, ensure_site, faq_questions, parse_page, serve, site_pages
from bench.workloads.tokens import TOKENIZERS, Counter, load_counter


@dataclass(frozen=True)
class CrawlParams:
    seeds: int = 3  # pages taken from the search step
    depth: int = 2  # BFS depth below the seeds
    max_links: int = 10  # links followed per page (first unseen ones, document order)
    max_pages: int = 40  # pages fetched per query
    page_threshold: float = 2.5  # BM25 score the best passage needs for the page to be kept
    passage_threshold: float = 1.0  # BM25 score a passage of a kept page needs
    max_page_tokens: int = 1500  # tokens kept per page
    max_context_tokens: int = 6000  # token budget of the whole context
    concurrency: int = 8  # fetches in flight


@dataclass(frozen=True)
class Chunk:
    url: str
    depth: int
    content: str
    tokens: int
    t_measured: float


@dataclass(frozen=True)
class Crawl:
    chunks: list[Chunk]
    seeds: list[str]
    fetched: int
    search_time: float


async def fetch_page(session: aiohttp.ClientSession, url: str) -> Page | None:
    """The parsed page, or None for a failed fetch or a non-HTML answer (a crawler moves on)."""
    try:
        async with session.get(url) as response:
            if response.status != 200 or "html" not in response.content_type:
                return None
            html = await response.text()
    except (aiohttp.ClientError, UnicodeDecodeError):
        return None
    return parse_page(html, url)


async def crawl(
    session: aiohttp.ClientSession,
    base_url: str,
    question: str,
    search: SiteSearch,
    params: CrawlParams,
    count_tokens: Counter,
) -> Crawl:
    """Search, then BFS from the seeds; returns the accepted pages in BFS order."""
    start = time.perf_counter()
    seeds = [base_url + page for page, _ in search.search(question, params.seeds)]
    search_time = time.perf_counter() - start

    async def visit(url: str) -> tuple[Page | None, list[int], float]:
        page = await fetch_page(session, url)
        kept = []
        if page is not None:
            kept = filter_passages(
                question,
                page.passages,
                params.page_threshold,
                params.passage_threshold,
                params.max_page_tokens,
                count_tokens,
            )
        return page, kept, time.perf_counter() - start

    chunks: list[Chunk] = []
    seen = set(seeds)
    level, fetched, used, clock = list(seeds), 0, 0, 0.0
    for depth in range(params.depth + 1):
        next_level: list[str] = []
        for i in range(0, len(level), params.concurrency):
            batch = level[i : i + params.concurrency][: params.max_pages - fetched]
            results = await asyncio.gather(*(visit(url) for url in batch))
            for url, (page, kept, done) in zip(batch, results, strict=True):
                fetched += 1
                clock = max(clock, done)
                if page is None:
                    continue
                if depth < params.depth:
                    fresh = [link for link in page.links if link not in seen][: params.max_links]
                    seen.update(fresh)
                    next_level.extend(fresh)
                if not kept:
                    continue
                passages = [page.passages[j] for j in kept]
                content, tokens = _fit(
                    page.title, passages, params.max_context_tokens - used, count_tokens
                )
                if content:
                    chunks.append(Chunk(url, depth, content, tokens, clock))
                    used += tokens
                if used >= params.max_context_tokens or content is None:
                    return Crawl(chunks, seeds, fetched, search_time)
            if fetched >= params.max_pages:
                return Crawl(chunks, seeds, fetched, search_time)
        level = next_level
    return Crawl(chunks, seeds, fetched, search_time)


def _fit(
    title: str, passages: list[str], budget: int, count_tokens: Counter
) -> tuple[str | None, int]:
    """The page's chunk (title line, then passages, one per line) cut to `budget` tokens at a
    passage boundary. None when the budget is full (not even the title and one passage fit)."""
    lines = [title + "\n"]
    total = count_tokens(lines[0])
    for passage in passages:
        n = count_tokens(passage + "\n")
        if total + n > budget:
            break
        lines.append(passage + "\n")
        total += n
    if len(lines) == 1:
        return None, 0
    return "".join(lines), total


def make_trace(
    anchor: str, question: str, result: Crawl, base_url: str, seed: int, index: int
) -> Trace:
    search_end, times = latency.crawler_timeline(len(result.chunks), latency.query_rng(seed, index))
    events = tuple(
        TraceEvent(
            t=round(t, 6),
            mode="append",
            content=chunk.content,
            t_measured=round(chunk.t_measured, 6),
        )
        for chunk, t in zip(result.chunks, times, strict=True)
    )
    answer_page = anchor.split("#")[0]
    urls = [chunk.url.removeprefix(base_url) for chunk in result.chunks]
    meta = {
        "source": "python3.11-doc",
        "faq_anchor": anchor,
        "search_end": round(search_end, 6),
        "search_time_measured": round(result.search_time, 6),
        "seeds": [s.removeprefix(base_url) for s in result.seeds],
        "urls": urls,
        "depths": [chunk.depth for chunk in result.chunks],
        "pages_fetched": result.fetched,
        "answer_page_in_context": answer_page in urls,
    }
    trace_id = "pydoc-" + anchor.replace("faq/", "").replace(".html#", "-")
    return Trace(trace_id, "crawler", "append", question, DEFAULT_TEMPLATE, events, meta)


async def run(
    root: Path,
    questions: Sequence[tuple[int, str, str]],
    params: CrawlParams,
    count_tokens: Counter,
    seed: int,
) -> tuple[list[Trace], int]:
    """Traces for `questions` (index among all FAQ questions, which seeds the timeline;
    page#anchor; text); also how many found nothing to keep."""
    pages = site_pages(root)
    texts = [
        parse_page((root / p).read_text(encoding="utf-8"), "http://site/" + p).text for p in pages
    ]
    search = SiteSearch(pages, texts)
    traces, empty = [], 0
    async with serve(root) as base_url:
        connector = aiohttp.TCPConnector(limit=params.concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            for i, anchor, question in tqdm(questions, desc="crawler queries", unit="q"):
                result = await crawl(session, base_url, question, search, params, count_tokens)
                if not result.chunks:
                    empty += 1
                    continue
                traces.append(make_trace(anchor, question, result, base_url, seed, i))
    return traces, empty


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    d = CrawlParams()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("datasets/crawler/traces.jsonl"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-queries", type=int, default=175, help="FAQ questions (175 = all)")
    p.add_argument("--max-context-tokens", type=int, default=d.max_context_tokens)
    p.add_argument("--max-page-tokens", type=int, default=d.max_page_tokens)
    p.add_argument("--max-pages", type=int, default=d.max_pages)
    p.add_argument("--max-links", type=int, default=d.max_links)
    p.add_argument("--seeds", type=int, default=d.seeds)
    p.add_argument("--page-threshold", type=float, default=d.page_threshold)
    p.add_argument("--passage-threshold", type=float, default=d.passage_threshold)
    p.add_argument(
        "--site",
        type=Path,
        default=None,
        help="extracted html root (default: the cache, filled by `make crawler-site`)",
    )
    p.add_argument("--tokenizer", choices=TOKENIZERS, default="smollm2")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    root = args.site or ensure_site()
    faq = faq_questions(root)
    picks = range(len(faq))
    if args.num_queries < len(faq):
        picks = sorted(np.random.default_rng(args.seed).permutation(len(faq))[: args.num_queries])
    questions = [(int(i), *faq[i]) for i in picks]
    params = CrawlParams(
        seeds=args.seeds,
        max_links=args.max_links,
        max_pages=args.max_pages,
        page_threshold=args.page_threshold,
        passage_threshold=args.passage_threshold,
        max_page_tokens=args.max_page_tokens,
        max_context_tokens=args.max_context_tokens,
    )
    count = load_counter(args.tokenizer)
    traces, empty = asyncio.run(run(root, questions, params, count, args.seed))
    write_traces(args.out, traces)
    extra: dict[str, Any] = {
        "questions": len(questions),
        "questions_without_context": empty,
        "answer_page_in_context": float(
            np.mean([t.meta["answer_page_in_context"] for t in traces])
        ),
        "pages_fetched_mean": float(np.mean([t.meta["pages_fetched"] for t in traces])),
        **vars(params),
    }
    headline = f"answer page in context {extra['answer_page_in_context']:.3f}"
    summary = write_report("crawler", traces, count, args, extra, headline)
    print(f"{summary}, {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
