"""Benchmark queries: the prompt split around the context, truncation to a token budget
(append and update semantics), scaled timelines, seeded selection."""

from __future__ import annotations

import re

import pytest

from bench.harness.presets import REPO_ROOT
from bench.harness.queries import (
    build_query,
    load_queries,
    select,
    split_template,
    truncate_append,
    truncate_update,
)
from bench.traces import DEFAULT_TEMPLATE, Trace, TraceEvent


class WordTokenizer:
    """One token per word (with its trailing spaces); decode(encode(s)) == s."""

    def __init__(self):
        self.vocab: list[str] = []
        self.index: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in re.findall(r"\s*\S+\s*|\s+", text):
            if word not in self.index:
                self.index[word] = len(self.vocab)
                self.vocab.append(word)
            ids.append(self.index[word])
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)


TOK = WordTokenizer()


def words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n)) + " "


def trace(mode: str, contents: list[str], times: list[float] | None = None) -> Trace:
    times = times or [0.5 * (i + 1) for i in range(len(contents))]
    events = tuple(TraceEvent(t, mode, c) for t, c in zip(times, contents, strict=True))
    return Trace("q1", "test", mode, "Why is the sky blue?", DEFAULT_TEMPLATE, events)


def test_head_context_tail_is_the_traces_prompt():
    t = trace("append", ["alpha ", "beta {question} "])
    head, tail = split_template(t.template, t.question)
    context = t.final_context
    assert head + context + tail == t.prompt(context)
    assert tail.endswith("Question: Why is the sky blue?") and "{" not in head + tail
    with pytest.raises(ValueError):
        split_template("no context here {question}", "q")


def test_append_keeps_whole_chunks_then_cuts_the_one_crossing_the_budget():
    chunks = [words("a", 10), words("b", 10), words("c", 10), words("d", 10)]
    kept = truncate_append(chunks, 25, TOK.encode, TOK.decode)
    assert kept[:2] == chunks[:2]
    assert len(kept) == 3 and chunks[2].startswith(kept[2])
    assert sum(len(TOK.encode(c)) for c in kept) == 25


def test_append_stops_exactly_at_the_budget_and_keeps_everything_under_it():
    chunks = [words("a", 10), words("b", 10), words("c", 10)]
    assert truncate_append(chunks, 20, TOK.encode, TOK.decode) == chunks[:2]
    assert truncate_append(chunks, 1000, TOK.encode, TOK.decode) == chunks
    assert truncate_append(chunks, 5, TOK.encode, TOK.decode) == [
        TOK.decode(TOK.encode(chunks[0])[:5])
    ]


def test_update_cuts_every_context_and_keeps_every_update():
    contexts = [words("x", 30), words("y", 8), words("z", 50)]
    out = truncate_update(contexts, 20, TOK.encode, TOK.decode)
    assert len(out) == 3
    assert out[1] == contexts[1]  # under the budget: unchanged
    assert [len(TOK.encode(c)) for c in out] == [20, 8, 20]
    assert contexts[0].startswith(out[0]) and contexts[2].startswith(out[2])


def test_append_query_ends_at_the_last_kept_chunk_with_scaled_times():
    t = trace("append", [words("a", 10), words("b", 10), words("c", 10)], [1.0, 2.0, 4.0])
    q = build_query(t, 15, TOK.encode, TOK.decode, delay_scale=10.0)
    assert [c.t for c in q.chunks] == [10.0, 20.0]  # the third chunk is past the budget
    assert q.final_t == 20.0
    assert q.final_prompt == t.prompt(words("a", 10) + q.chunks[1].text)
    assert q.cached_prefix == q.head + words("a", 10)  # the lower bound's cached part
    assert q.prompt(0) + q.chunks[1].text + q.tail == q.final_prompt


def test_update_query_keeps_its_updates_cut_and_the_question_last():
    t = trace("update", [words("x", 30), words("y", 40)], [0.1, 3.0])
    q = build_query(t, 12, TOK.encode, TOK.decode)
    assert [c.t for c in q.chunks] == [0.1, 3.0]
    assert len(TOK.encode(q.context(1))) == 12 and q.context(1) != q.context(0)
    assert q.final_prompt == t.prompt(q.context(1)) and q.final_prompt.endswith(t.question)
    assert q.cached_prefix == q.head + q.context(0)


def test_without_a_budget_the_query_is_the_trace():
    t = trace("append", ["one ", "two ", "three "])
    q = build_query(t)
    assert q.final_prompt == t.prompt(t.final_context)
    assert [q.context(i) for i in range(3)] == list(t.contexts())
    single = build_query(trace("append", ["only "]))
    assert single.cached_prefix is None


def test_select_is_seeded_and_keeps_file_order():
    traces = [trace("append", [f"t{i} "]) for i in range(30)]
    traces = [
        Trace(f"q{i}", t.workload, t.mode, t.question, t.template, t.events)
        for i, t in enumerate(traces)
    ]
    a, b = select(traces, 6, 0), select(traces, 6, 0)
    assert [t.id for t in a] == [t.id for t in b]
    assert [t.id for t in a] != [t.id for t in select(traces, 6, 1)]
    idx = [int(t.id[1:]) for t in a]
    assert idx == sorted(idx) and len(set(idx)) == 6
    assert select(traces, None, 0) == traces and select(traces, 99, 0) == traces


@pytest.mark.parametrize("name", ["crawler", "ann"])
def test_real_traces_fit_the_budget(name):
    from bench.harness.presets import WORKLOAD_FILES

    tok = WordTokenizer()
    qs = load_queries(REPO_ROOT / WORKLOAD_FILES[name], 5, 0, 200, tok.encode, tok.decode)
    assert len(qs) == 5
    for q in qs:
        tokens = [len(tok.encode(q.context(i))) for i in range(len(q.chunks))]
        # Per-chunk counts are summed for append, so re-tokenizing the join may differ a little.
        assert max(tokens) <= 200 + len(q.chunks)
        times = [c.t for c in q.chunks]
        assert times == sorted(times)
