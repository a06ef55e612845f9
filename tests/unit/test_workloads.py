"""Workload generators' parts: latency models, progressive search, BM25, site parsing, the
crawler's BFS over a tiny site served on 127.0.0.1, and the statistics of the cards."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from bench.traces import DEFAULT_TEMPLATE, Trace, TraceEvent
from bench.workloads import latency
from bench.workloads.stats import STATS_BEGIN, STATS_END, arrivals, update_card, workload_stats
from bench.workloads.tokens import load_counter, truncate_to_tokens

chars4 = load_counter("chars4")


# --- latency models -------------------------------------------------------------------------


def test_lognormal_fits_median_and_p95():
    dist = latency.LogNormal.from_median_p95(0.7007, 3.078)
    sample = dist.sample(np.random.default_rng(1), 200_000)
    assert np.median(sample) == pytest.approx(0.7007, rel=0.02)
    assert np.percentile(sample, 95) == pytest.approx(3.078, rel=0.03)


def test_lognormal_fits_mean_and_p95():
    dist = latency.LogNormal.from_mean_p95(4.47, 8.51)
    assert dist.mean == pytest.approx(4.47) and dist.quantile(0.95) == pytest.approx(8.51)
    sample = dist.sample(np.random.default_rng(2), 200_000)
    assert np.mean(sample) == pytest.approx(4.47, rel=0.02)
    with pytest.raises(ValueError):
        latency.LogNormal.from_mean_p95(1.0, 100.0)  # too wide a tail for any lognormal


def test_crawler_model_reproduces_the_papers_gaps_and_collection_time():
    traces = []
    for i in range(4000):
        rng = latency.query_rng(0, i)
        pages = 7  # the paper's 7.86 chunks per query, less the search
        search_end, times = latency.crawler_timeline(pages, rng)
        events = tuple(TraceEvent(t, "append", "x") for t in times)
        traces.append(
            Trace(str(i), "c", "append", "q", DEFAULT_TEMPLATE, events, {"search_end": search_end})
        )
    gaps = [g for t in traces for g in arrivals(t)[1]]
    assert np.median(gaps) == pytest.approx(0.7007, rel=0.05)
    assert np.percentile(gaps, 95) == pytest.approx(3.078, rel=0.08)
    assert np.mean([t.duration for t in traces]) == pytest.approx(9.22, rel=0.05)


def test_ann_model_reproduces_the_papers_gap_and_duration():
    gaps, durations = [], []
    for i in range(4000):
        times = latency.ann_timeline(4, latency.query_rng(0, i))
        assert times == sorted(times) and times[-1] > times[-2]
        trace = Trace(
            str(i),
            "a",
            "update",
            "q",
            DEFAULT_TEMPLATE,
            tuple(TraceEvent(t, "update", "x") for t in times),
        )
        gaps.extend(arrivals(trace)[1])
        durations.append(trace.duration)
    assert np.median(gaps) == pytest.approx(0.0367, rel=0.06)
    assert np.mean(durations) == pytest.approx(4.47, rel=0.05)
    assert np.percentile(durations, 95) == pytest.approx(8.51, rel=0.06)


def test_timelines_are_seeded_per_query():
    assert latency.ann_timeline(3, latency.query_rng(7, 1)) == latency.ann_timeline(
        3, latency.query_rng(7, 1)
    )
    assert latency.ann_timeline(3, latency.query_rng(7, 1)) != latency.ann_timeline(
        3, latency.query_rng(7, 2)
    )
    search_end, times = latency.crawler_timeline(5, latency.query_rng(0, 0))
    assert len(times) == 5 and search_end < times[0] and times == sorted(times)


# --- progressive search ---------------------------------------------------------------------


def tiny_index(n: int = 300, dim: int = 16, seed: int = 0):
    from bench.workloads.ann import build_index

    vectors = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors, build_index(vectors, m=8)


def test_progressive_search_converges_to_the_exact_top_k():
    pytest.importorskip("faiss")
    from bench.workloads.progressive import HnswGraph, progressive_search

    vectors, index = tiny_index()
    graph = HnswGraph(index)
    rng = np.random.default_rng(5)
    for _ in range(10):
        query = vectors[rng.integers(len(vectors))] + 0.3 * rng.standard_normal(16).astype(
            np.float32
        )
        windows = progressive_search(graph, vectors, query, k=10, ef=len(vectors))
        exact = tuple(np.argsort(-(vectors @ query), kind="stable")[:10].tolist())
        assert windows[-1].pool == exact
        # windows tile the search: each starts where the previous one ended
        for a, b in pairwise(windows):
            assert a.end_iteration == b.start_iteration and a.pool != b.pool
            assert a.t_end <= b.t_end
        for w in windows:  # pools ranked by decreasing similarity
            sims = vectors[list(w.pool)] @ query
            assert np.all(np.diff(sims) <= 1e-6)


def test_progressive_search_refines_and_min_change_thins_updates():
    pytest.importorskip("faiss")
    from bench.workloads.progressive import HnswGraph, progressive_search

    vectors, index = tiny_index(n=400)
    graph = HnswGraph(index)
    query = vectors[3]
    every = progressive_search(graph, vectors, query, k=10, ef=40)
    thinned = progressive_search(graph, vectors, query, k=10, ef=40, min_change=0.5)
    assert len(every) > len(thinned) >= 1
    assert every[-1].pool == thinned[-1].pool  # the converged pool always closes the search
    assert every[-1].pool[0] == 3  # the query's own vector ranks first
    for a, b in pairwise(thinned[:-1]):  # the last may change less
        assert len(set(b.pool) - set(a.pool)) >= 5
    with pytest.raises(ValueError):
        progressive_search(graph, vectors, query, k=10, ef=5)


def test_fit_pools_cuts_to_budget_and_merges_equal_cuts():
    pytest.importorskip("faiss")
    from bench.workloads.ann import fit_pools
    from bench.workloads.progressive import Window

    windows = [
        Window((1, 2, 3), 0, 2, 0.1, 0.2),
        Window((1, 2, 4), 2, 5, 0.2, 0.3),
        Window((2, 1, 3), 5, 9, 0.3, 0.4),
    ]
    tokens = {1: 40, 2: 50, 3: 30, 4: 30}
    fitted = fit_pools(windows, tokens, budget=100)
    assert [pool for pool, _ in fitted] == [(1, 2), (2, 1)]
    merged = fitted[0][1]
    assert (merged.start_iteration, merged.end_iteration, merged.t_end) == (0, 5, 0.3)


# --- BM25 and the site ----------------------------------------------------------------------


def test_bm25_search_and_passage_filter():
    pytest.importorskip("bm25s")
    from bench.workloads.bm25 import SiteSearch, filter_passages

    search = SiteSearch(
        ["a", "b", "c"],
        [
            "recipes for pasta and tomato sauce",
            "python snakes eat rodents and birds",
            "the python language has lists and dicts",
        ],
    )
    assert [page for page, _ in search.search("what do python snakes eat", 2)] == ["b", "c"]
    assert search.search("zebra", 3) == []

    passages = [
        "Pasta needs water.",
        "Snakes eat rodents.",
        "Tomatoes are red.",
        "Python snakes are constrictors.",
    ]
    assert filter_passages("What do python snakes eat?", passages, 0.5, 0.1) == [1, 3]
    assert filter_passages("What do python snakes eat?", passages, 50.0, 0.1) == []  # page rejected
    capped = filter_passages("What do python snakes eat?", passages, 0.5, 0.1, 6, chars4)
    assert len(capped) == 1


def page(body: str, extra: str = "") -> str:
    return f"""<html><head><title>T{extra} &#8212; Python 3.11.2 documentation</title></head><body>
<div class="sphinxsidebar"><a href="nav.html">Navigation</a></div>
<div class="body" role="main"><h1>Heading<a class="headerlink" href="#h">¶</a></h1>
{body}
<script>var x = 1;</script></div><div class="footer"><a href="footer.html">f</a></div></body></html>"""


def test_parse_page_reads_main_body_passages_and_links():
    from bench.workloads.site import parse_page

    html = page(
        '<p>First   paragraph with <a href="a.html#sec">a link</a>.</p>'
        "<ul><li>item one</li><li>item <b>two</b></li></ul>"
        "<pre>x = 1\n  y = 2</pre>"
        '<p><a href="genindex.html">index</a> <a href="http://other.org/z.html">ext</a>'
        ' <a href="../up/b.html">b</a> <a href="a.html">again</a> <a href="#local">self</a></p>',
        extra="x",
    )
    parsed = parse_page(html, "http://h:1/dir/p.html")
    assert parsed.title == "Tx"
    assert parsed.passages == (
        "Heading",
        "First paragraph with a link.",
        "item one",
        "item two",
        "x = 1\n  y = 2",
        "index ext b again self",
    )
    assert parsed.links == ("http://h:1/dir/a.html", "http://h:1/up/b.html")


def test_faq_questions_are_headings_ending_with_a_question_mark(tmp_path):
    from bench.workloads.site import faq_questions

    (tmp_path / "faq").mkdir()
    (tmp_path / "faq" / "general.html").write_text(
        '<h2>What is Python?<a class="headerlink" href="#what-is-python">¶</a></h2>'
        '<h2>Overview<a class="headerlink" href="#overview">¶</a></h2>'
        '<h3>Why can&#8217;t I use <code>x</code>?<a class="headerlink" href="#why">¶</a></h3>'
    )
    assert faq_questions(tmp_path) == [
        ("faq/general.html#what-is-python", "What is Python?"),
        ("faq/general.html#why", "Why can’t I use x?"),
    ]


# --- the crawler over a tiny site on 127.0.0.1 -----------------------------------------------

SITE = {
    "index.html": (
        "<p>Python snakes: what do they eat? Start here.</p>"
        '<a href="a.html">a</a> <a href="b.html">b</a> <a href="genindex.html">g</a>'
    ),
    "a.html": '<p>Pythons are snakes that eat rodents.</p><p>Unrelated words.</p><a href="c.html">c</a>',
    "b.html": '<p>Recipes for pasta.</p><a href="d.html">d</a> <a href="a.html">a</a>',
    "c.html": '<p>Python snakes eat birds too.</p><a href="e.html">e</a>',
    "d.html": '<p>Snakes eat eggs.</p><a href="e.html">e</a>',
    "e.html": "<p>Python snakes eat everything, three links deep.</p>",
    "genindex.html": "<p>Python snakes eat index entries.</p>",
}


def write_site(root: Path) -> None:
    for name, body in SITE.items():
        (root / name).write_text(page(body, extra=name.removesuffix(".html")), encoding="utf-8")


def run_crawl(root: Path, **params):
    pytest.importorskip("bm25s")
    import aiohttp

    from bench.workloads.bm25 import SiteSearch
    from bench.workloads.crawler import CrawlParams, crawl
    from bench.workloads.site import serve

    search = SiteSearch(["index.html"], ["python snakes eat"])  # the search step finds the index
    settings = CrawlParams(seeds=1, page_threshold=0.1, passage_threshold=0.1, **params)

    async def main():
        async with serve(root) as base_url, aiohttp.ClientSession() as session:
            result = await crawl(
                session, base_url, "What do python snakes eat?", search, settings, chars4
            )
            return base_url, result

    return asyncio.run(main())


def test_crawler_goes_breadth_first_to_depth_two(tmp_path):
    write_site(tmp_path)
    base_url, result = run_crawl(tmp_path)
    urls = [c.url.removeprefix(base_url) for c in result.chunks]
    assert base_url.startswith("http://127.0.0.1:")
    # b.html is fetched (its link d.html is followed) but rejected; e.html is at depth 3;
    # genindex.html is a navigation page
    assert urls == ["index.html", "a.html", "c.html", "d.html"]
    assert [c.depth for c in result.chunks] == [0, 1, 2, 2]
    assert result.fetched == 5
    assert result.chunks[1].content == "Ta\nPythons are snakes that eat rodents.\n"
    assert all(a.t_measured <= b.t_measured for a, b in pairwise(result.chunks))
    _, deeper = run_crawl(tmp_path, depth=3)
    assert deeper.chunks[-1].url.endswith("/e.html")


def test_crawler_stops_at_the_token_budget_and_page_limit(tmp_path):
    write_site(tmp_path)
    _, result = run_crawl(tmp_path, max_context_tokens=25)
    assert [c.depth for c in result.chunks] == [0, 1]
    assert sum(c.tokens for c in result.chunks) <= 25
    _, result = run_crawl(tmp_path, max_pages=2)
    assert result.fetched == 2 and len(result.chunks) == 2


# --- statistics and cards -------------------------------------------------------------------


def test_workload_stats_use_the_papers_definitions(tmp_path):
    append = Trace(
        "a",
        "c",
        "append",
        "q",
        DEFAULT_TEMPLATE,
        (TraceEvent(1.0, "append", "abcd" * 10), TraceEvent(1.5, "append", "abcd" * 5)),
        {"search_end": 0.5},
    )
    update = Trace(
        "u",
        "a",
        "update",
        "q",
        DEFAULT_TEMPLATE,
        (
            TraceEvent(0.1, "update", "x" * 8),
            TraceEvent(0.3, "update", "y" * 8),
            TraceEvent(4.0, "update", "z" * 40, 0.002),
        ),
    )
    assert arrivals(append) == ([0.5, 1.0, 1.5], [0.5, 0.5])
    assert arrivals(update)[1] == pytest.approx([0.1, 0.2])  # window starts 0, 0.1, 0.3
    stats = workload_stats([append, update], chars4)
    assert stats["chunks_mean"] == 3 and stats["chunks_max"] == 3
    assert stats["tokens_mean"] == pytest.approx((15 + 10) / 2)
    assert stats["duration_mean"] == pytest.approx(2.75)
    assert stats["measured_duration_mean"] == pytest.approx(0.002)

    card = tmp_path / "CARD.md"
    card.write_text(f"# Card\n{STATS_BEGIN}\nold\n{STATS_END}\ntail\n")
    assert update_card(card, "| new |")
    assert card.read_text() == f"# Card\n{STATS_BEGIN}\n| new |\n{STATS_END}\ntail\n"
    assert not update_card(tmp_path / "missing.md", "x")


def test_truncate_to_tokens():
    assert truncate_to_tokens(["a", "b", "c"], [3, 4, 5], 7) == 2
    assert truncate_to_tokens(["a", "b"], [3, 4], 100) == 2
    assert truncate_to_tokens(["a"], [3], 2) == 0
