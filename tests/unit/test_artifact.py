"""Loaders for the Stream2LLM artifact's crawler and ANN formats, on hand-made fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.artifact import load_ann_pipeline, load_crawler_csv, parse_pipeline_pool

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "artifact"
CRAWLER = FIXTURES / "crawler"
ANN = FIXTURES / "ann"


def test_crawler_directory_reads_query_files_in_numeric_order():
    traces = load_crawler_csv(CRAWLER)
    assert [t.id for t in traces] == ["query_2", "query_10"]  # not two_queries.csv
    assert all(t.mode == "append" and t.workload == "crawler-artifact" for t in traces)


def test_crawler_events_follow_end_times_and_skip_the_search_row():
    (trace,) = load_crawler_csv(CRAWLER / "query_2.csv")
    assert trace.question == "Who wrote the Python FAQ?"  # page rows left `query` empty
    assert [e.t for e in trace.events] == [1.9, 3.5]
    assert trace.events[0].content.startswith("First page")
    assert trace.final_context == (
        "First page: the FAQ was written by the Python community.\nSecond page, scraped last.\n"
    )
    assert trace.meta["search_end"] == 0.8
    assert "snippets" not in trace.final_context


def test_crawler_times_are_relative_to_the_first_start():
    (trace,) = load_crawler_csv(CRAWLER / "query_10.csv")
    assert [e.t for e in trace.events] == pytest.approx([1.0, 1.25])
    assert trace.meta["search_end"] == pytest.approx(0.5)
    assert (
        trace.events[0].content == "A list is a mutable sequence.\nIt can hold items of any type.\n"
    )
    assert trace.events[1].content == "\n"  # an empty scrape still arrives


def test_crawler_rows_of_several_queries_are_grouped_by_query():
    traces = load_crawler_csv(CRAWLER / "two_queries.csv")
    by_question = {t.question: t for t in traces}
    assert set(by_question) == {"first question?", "second question?"}
    assert by_question["first question?"].final_context == "answer one\n"
    assert by_question["second question?"].events[0].t == 0.75
    assert len({t.id for t in traces}) == 2


def test_parse_pipeline_pool():
    assert parse_pipeline_pool("(62952551,79119332, 83808733)") == [
        "62952551",
        "79119332",
        "83808733",
    ]
    assert parse_pipeline_pool('"(7)"') == ["7"]
    assert parse_pipeline_pool("()") == []


def test_ann_pipeline_replays_windows_like_the_artifact():
    traces = load_ann_pipeline(
        ANN / "res", ANN / "query_trace_map.json", str(ANN / "*.part.*.json")
    )
    assert [t.id for t in traces] == ["0", "1"]
    trace = traces[0]
    assert trace.mode == "update" and trace.question == "Which river flows through the city?"
    # each pool is sent after its window: cumulative window durations
    assert [e.t for e in trace.events] == pytest.approx([0.02, 0.0567, 3.9999999])
    assert (
        trace.events[0].content
        == "The Thames flows through London.\nLondon is a city in England.\n"
    )
    assert trace.final_context.startswith("The river Thames runs through the heart of London.\n")
    assert trace.final_context.endswith("Tower Bridge was built between 1886 and 1894.\n")
    assert trace.meta["pools"][1] == ["13", "11", "12"]
    assert trace.meta["iterations"][-1] == [9, 10000]
    assert trace.meta["missing_docs"] == 0


def test_ann_single_file_missing_docs_and_extra_map_keys():
    corpus = [
        ANN / "retrieved_corpus_content.part.0.json",
        ANN / "retrieved_corpus_content.part.1.json",
    ]
    (trace,) = load_ann_pipeline(
        ANN / "res" / "1_pipeline_trace.csv", ANN / "query_trace_map.json", corpus
    )
    assert trace.id == "1"
    assert trace.final_context == "Tower Bridge was built between 1886 and 1894.\n"
    assert trace.meta["missing_docs"] == 1  # doc 99 is not in the corpus
    assert trace.meta["recall"] == 0.9
    assert trace.events[0].t == pytest.approx(0.25)
