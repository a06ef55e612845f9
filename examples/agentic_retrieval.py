"""Agentic retrieval with a streamed context: the model prefills passages while retrieval goes on.

An SGLang program answers a SQuAD question from passages that a BM25 retriever finds over the
whole SQuAD v1.1 dev set. The passages reach the program through `stream_context` batch by
batch, so the engine prefills each batch while the retriever is still working; when retrieval
ends, only the question is left to prefill before the first answer token.

Retrieval is fast here (BM25 in memory), so its slowness is simulated, and documented: results
arrive in batches `--delay` seconds apart, as from a remote search API or an agent that issues
one tool call per batch.
- append mode: batch i holds ranks [i*b, (i+1)*b) of the BM25 ranking; each batch is appended.
- update mode: each round re-ranks with pseudo-relevance feedback (the question plus salient
  terms of the previous round's best passage) and replaces the context by the new top-k list.
Streaming pays when the engine prefills a batch faster than the next one arrives: on a slow or
busy CPU, raise `--delay` or lower `--top-k`/`--batch` (the output says how many prompt tokens
were still unprefilled at finish).

Data: SQuAD v1.1 dev (Rajpurkar, Zhang, Lopyrev, Liang: "SQuAD: 100,000+ Questions for Machine
Comprehension of Text", EMNLP 2016), CC BY-SA 4.0: 48 Wikipedia articles, 2,067 paragraphs,
10,570 questions, shipped in the repository (`datasets/squad/`, see its CARD.md) and read by
`bench.workloads.squad.load_squad` (`--squad PATH` for another copy, .json or .json.xz).
Retriever: bm25s (BM25 on sparse matrices), pinned in requirements-workloads.txt (installed by
`make`).

    .venv/bin/python examples/agentic_retrieval.py                  # in-process engine, CPU
    .venv/bin/python examples/agentic_retrieval.py --mode update --compare
    .venv/bin/python examples/agentic_retrieval.py --url http://127.0.0.1:30000 --api-key KEY

Prints the retrieval timeline, the answer, its TTFT (`meta_info["stream"]["ttft_s"]`: from the
finish, right after the last batch, to the first token) and the gold answers. `--compare` also
runs the same program with the whole context given at once after retrieval (prefix cache
flushed first), for its TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench.workloads.squad import DEFAULT_SQUAD
from bench.workloads.squad import load_squad as read_squad


@dataclass(frozen=True)
class Paragraph:
    title: str
    text: str

    def render(self, rank: int) -> str:
        return f"[{rank}] {self.title.replace('_', ' ')}: {self.text}"


@dataclass(frozen=True)
class Question:
    qid: str
    text: str
    answers: list[str]
    paragraph: int  # index of the paragraph that answers it


def load_squad(path: Path) -> tuple[list[Paragraph], list[Question]]:
    """All paragraphs of the SQuAD file, and its questions tied to their paragraph."""
    squad = read_squad(path)
    paragraphs = [Paragraph(t, p) for t, p in zip(squad.titles, squad.paragraphs, strict=True)]
    questions = [Question(q.id, q.text, list(q.answers), q.gold) for q in squad.questions]
    return paragraphs, questions


class Retriever:
    """BM25 (bm25s) over the paragraphs, with a simulated delay between result batches."""

    def __init__(self, paragraphs: list[Paragraph], delay: float):
        try:
            import bm25s
            from bm25s.stopwords import STOPWORDS_EN
        except ImportError as exc:
            raise SystemExit(
                "this example needs bm25s (pinned in requirements-workloads.txt): run `make venv`"
            ) from exc

        self.bm25s = bm25s
        self.stopwords = set(STOPWORDS_EN)
        self.paragraphs = paragraphs
        self.delay = delay
        self.index = bm25s.BM25()
        texts = [f"{p.title.replace('_', ' ')} {p.text}" for p in paragraphs]
        self.index.index(
            bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False
        )
        self.log: list[tuple[float, str]] = []  # (seconds since the first call, what arrived)

    def rank(self, query: str, k: int) -> list[int]:
        tokens = self.bm25s.tokenize([query], stopwords="en", show_progress=False)
        ids, _ = self.index.retrieve(tokens, k=k, show_progress=False)
        return [int(i) for i in ids[0]]

    def feedback_terms(self, paragraph: int, question: str, n: int = 5) -> list[str]:
        """Salient terms of a passage for pseudo-relevance feedback (frequent, not in the query)."""
        asked = set(re.findall(r"\w\w+", question.lower()))
        words = re.findall(r"\w\w+", self.paragraphs[paragraph].text.lower())
        counts = collections.Counter(
            w for w in words if w not in self.stopwords and w not in asked and not w.isdigit()
        )
        return [w for w, _ in counts.most_common(n)]

    async def batches(self, question: str, top_k: int, batch: int) -> AsyncIterator[str]:
        """Append mode: the ranking's passages, `batch` at a time, `delay` s apart."""
        start = time.perf_counter()
        ranking = self.rank(question, top_k)
        for first in range(0, len(ranking), batch):
            await asyncio.sleep(self.delay)  # the simulated slow retrieval
            ids = ranking[first : first + batch]
            self.log.append((time.perf_counter() - start, f"ranks {first + 1}-{first + len(ids)}"))
            yield "".join(
                self.paragraphs[i].render(first + j + 1) + "\n\n" for j, i in enumerate(ids)
            )

    async def refinements(self, question: str, top_k: int, rounds: int) -> AsyncIterator[list[str]]:
        """Update mode: `rounds` re-rankings with feedback terms, `delay` s apart."""
        start = time.perf_counter()
        query = question
        for r in range(rounds):
            await asyncio.sleep(self.delay)
            ranking = self.rank(query, top_k)
            self.log.append((time.perf_counter() - start, f"round {r + 1}: {query!r}"))
            yield [self.paragraphs[i].render(rank + 1) for rank, i in enumerate(ranking)]
            query = question + " " + " ".join(self.feedback_terms(ranking[0], question))
        self.last_ranking = ranking


def build_program():
    import sglang as sgl

    from frontend import stream_context

    @sgl.function
    def answer_question(s, question, passages, mode, max_tokens):
        s += sgl.system("Answer the question from the passages. Reply with a short phrase.")
        with s.user():
            s += "Passages:\n"
            if mode == "given":
                s += passages
            else:
                s += stream_context(passages, mode=mode)
            s += "\n\nQuestion: " + question
        s += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens, temperature=0))

    return answer_question


def time_to_first_token(program, backend, **kwargs) -> tuple[float, str]:
    """Run `program` streaming its output: seconds to the first answer text, and the answer."""
    start = time.perf_counter()
    state = program.run(backend=backend, stream=True, **kwargs)
    first, pieces = None, []
    for piece in state.text_iter("answer"):
        if first is None and piece:
            first = time.perf_counter() - start
        pieces.append(piece)
    return first or time.perf_counter() - start, "".join(pieces)


def make_backend(args: argparse.Namespace):
    if args.url:
        import sglang as sgl

        return sgl.RuntimeEndpoint(
            args.url, api_key=args.api_key, chat_template_name="chatml"
        ), None
    from frontend.backend import StreamEngineBackend
    from s2l_sglang.stream.engine import StreamEngine

    start = time.perf_counter()
    engine = StreamEngine(log_level="error")
    engine.generate("warm up", {"max_new_tokens": 1})  # the first request compiles kernels
    print(f"engine started in {time.perf_counter() - start:.1f} s (in process, CPU defaults)")
    return StreamEngineBackend(engine, chat_template_name="chatml"), engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--squad", type=Path, default=DEFAULT_SQUAD, help="SQuAD v1.1 JSON file (.json or .json.xz)"
    )
    parser.add_argument("--index", type=int, default=0, help="question number in the file")
    parser.add_argument("--question-id", help="SQuAD question id (overrides --index)")
    parser.add_argument("--mode", choices=["append", "update"], default="append")
    parser.add_argument("--top-k", type=int, default=6, help="passages retrieved")
    parser.add_argument("--batch", type=int, default=2, help="passages per batch (append mode)")
    parser.add_argument("--rounds", type=int, default=3, help="re-rankings (update mode)")
    parser.add_argument("--delay", type=float, default=2.0, help="seconds between batches")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--url", help="an `s2l serve` server (default: in-process engine)")
    parser.add_argument("--api-key", help="the server's --api-key")
    parser.add_argument(
        "--compare", action="store_true", help="also time the context given at once"
    )
    args = parser.parse_args()

    paragraphs, questions = load_squad(args.squad)
    by_id = {q.qid: q for q in questions}
    question = by_id[args.question_id] if args.question_id else questions[args.index]
    retriever = Retriever(paragraphs, args.delay)
    print(f"corpus: {len(paragraphs)} SQuAD v1.1 dev paragraphs (CC BY-SA 4.0), BM25 (bm25s)")
    print(f"question [{question.qid}]: {question.text}")

    backend, engine = make_backend(args)
    program = build_program()
    try:
        if args.mode == "append":
            source = retriever.batches(question.text, args.top_k, args.batch)
        else:
            source = retriever.refinements(question.text, args.top_k, args.rounds)
        state = program.run(
            question=question.text,
            passages=source,
            mode=args.mode,
            max_tokens=args.max_tokens,
            backend=backend,
        )
        answer = state["answer"]
        meta = state.get_meta_info("answer")
        if state.error() is not None:
            raise state.error()
        for at, what in retriever.log:
            print(f"  {at:5.2f} s  retrieved {what}")
        ranking = retriever.rank(question.text, args.top_k)
        if args.mode == "update":
            ranking = retriever.last_ranking
        gold_rank = ranking.index(question.paragraph) + 1 if question.paragraph in ranking else None
        stream = meta["stream"]
        print(f"answer: {answer.strip()!r}")
        print(
            f"TTFT {stream['ttft_s']:.3f} s after the last batch ({args.mode} mode; "
            f"{meta['prompt_tokens']} prompt tokens, {stream['unprefilled_at_finish']} left to "
            f"prefill at finish, {stream['chunks']} chunks, {stream['turns']} engine turns)"
        )
        print(f"gold answers: {sorted(set(question.answers))}")
        print(f"gold paragraph retrieved: {f'rank {gold_rank}' if gold_rank else 'no'}")
        if args.compare:
            docs = [paragraphs[i].render(r + 1) for r, i in enumerate(ranking)]
            if args.mode == "append":
                context = "".join(d + "\n\n" for d in docs)
            else:
                context = "\n\n".join(docs)
            backend.flush_cache()  # no help from the streamed run's cached prefix
            ttft, plain = time_to_first_token(
                program,
                backend,
                question=question.text,
                passages=context,
                mode="given",
                max_tokens=args.max_tokens,
            )
            print(
                f"without streaming (whole context at once): TTFT {ttft:.3f} s, {plain.strip()!r}"
            )
    finally:
        if engine is not None:
            engine.shutdown()


if __name__ == "__main__":  # SGLang starts its processes with spawn: keep the guard
    main()
