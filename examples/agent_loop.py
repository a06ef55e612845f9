"""An agent that calls a tool between two generations, on one stream kept open.

The model reads a SQuAD question and writes a search query (turn 1). A deterministic local tool,
BM25 search over the SQuAD v1.1 dev paragraphs, runs that query (with the question) and returns
the best paragraph; the program appends it, and the model answers (turn 2). The program is an
SGLang program with `stream_context(..., keep_open=True)`: the gen of turn 1 finishes the
stream but keeps it open, so its prompt and the generated tokens stay on the engine as the
stream's history (their KV held), the tool's result is appended after them, and the gen of
turn 2 generates again without recomputing the history. The stream is aborted when the program
ends (it was kept open).

Token level: the tool's text is tokenized on its own and goes after the generated token ids,
so turn 2's prompt is turn 1's prompt ids + its output ids + the new text's ids (`--compare`
checks the answer against a plain request over exactly those ids).

Data: SQuAD v1.1 dev (Rajpurkar et al., EMNLP 2016, CC BY-SA 4.0), shipped in `datasets/squad/`
and read by `bench.workloads.squad.load_squad`; BM25 by bm25s (requirements-workloads.txt).

    .venv/bin/python examples/agent_loop.py                  # in-process engine, CPU
    .venv/bin/python examples/agent_loop.py --index 7 --compare
    .venv/bin/python examples/agent_loop.py --url http://127.0.0.1:30000 --api-key KEY

Prints both turns, the tool call, TTFT per generation (`meta_info["stream"]["ttft_s"]`: from
the finish to the first output token) and how many prompt tokens of turn 2 were the history
reused rather than recomputed. `--compare` (in process only) also times turn 2's prompt as a
plain request with the prefix cache flushed, and checks that its output is the same.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # agentic_retrieval, run as a script

from agentic_retrieval import Retriever, load_squad, make_backend  # noqa: E402

from bench.workloads.squad import DEFAULT_SQUAD  # noqa: E402

SYSTEM = "You answer questions about Wikipedia articles. You can search them."
ASK_QUERY = "\n\nFirst, write a short search query for this question."
ASK_ANSWER = "Search result:\n{result}\n\nNow answer the question with a short phrase."


def build_program(search):
    import sglang as sgl

    from frontend import stream_context

    @sgl.function
    def agent(s, question, max_tokens):
        s += sgl.system(SYSTEM)
        with s.user():
            s += "Question: " + question
            s += stream_context([ASK_QUERY], keep_open=True)  # each gen keeps the stream open
        s += sgl.assistant(sgl.gen("query", max_tokens=max_tokens, temperature=0))
        # the tool runs in the program; its result is appended after the generated tokens
        s += sgl.user(ASK_ANSWER.format(result=search(question, s["query"])))
        s += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens, temperature=0))

    return agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--squad", type=Path, default=DEFAULT_SQUAD, help="SQuAD v1.1 JSON file")
    parser.add_argument("--index", type=int, default=0, help="question number in the file")
    parser.add_argument("--max-tokens", type=int, default=24, help="per generation")
    parser.add_argument("--url", help="an `s2l serve` server (default: in-process engine)")
    parser.add_argument("--api-key", help="the server's --api-key")
    parser.add_argument(
        "--compare", action="store_true", help="time turn 2's prompt as a plain request"
    )
    args = parser.parse_args()
    if args.compare and args.url:
        parser.error("--compare needs the in-process engine")

    paragraphs, questions = load_squad(args.squad)
    question = questions[args.index]
    retriever = Retriever(paragraphs, delay=0.0)
    calls: list[tuple[str, int, float]] = []

    def search(question_text: str, query: str) -> str:
        """The tool: BM25 over all paragraphs, for the model's query and the question."""
        start = time.perf_counter()
        best = retriever.rank(f"{question_text} {query}", 1)[0]
        calls.append((query.strip(), best, time.perf_counter() - start))
        p = paragraphs[best]
        return f"{p.title.replace('_', ' ')}: {p.text}"

    print(f"corpus: {len(paragraphs)} SQuAD v1.1 dev paragraphs (CC BY-SA 4.0), BM25 (bm25s)")
    print(f"question [{question.qid}]: {question.text}")
    backend, engine = make_backend(args)
    try:
        state = agent_run(build_program(search), backend, question.text, args.max_tokens)
        query_meta, answer_meta = state.get_meta_info("query"), state.get_meta_info("answer")
        query, found, tool_s = calls[0]
        first, second = query_meta["stream"], answer_meta["stream"]
        history = query_meta["prompt_tokens"] + query_meta["completion_tokens"]
        print(
            f"turn 1 (model): {state['query'].strip()!r}\n"
            f"  TTFT {first['ttft_s']:.3f} s; prompt {query_meta['prompt_tokens']} tokens, "
            f"{query_meta['completion_tokens']} generated; stream kept open: {first['kept_open']}"
        )
        gold = "the gold paragraph" if found == question.paragraph else "not the gold paragraph"
        print(
            f"tool search({query!r}): paragraph {found} "
            f"({paragraphs[found].title}, {gold}) in {tool_s * 1000:.0f} ms"
        )
        cached = answer_meta.get("cached_tokens", 0)
        print(
            f"turn 2 (model): {state['answer'].strip()!r}\n"
            f"  TTFT {second['ttft_s']:.3f} s; prompt {answer_meta['prompt_tokens']} tokens: "
            f"{history} of turn 1 (its prompt and output, held), "
            f"{answer_meta['prompt_tokens'] - history} new (the tool's result); "
            f"{cached} served from held KV, {answer_meta['prompt_tokens'] - cached} computed "
            "(the last generated token has no KV until the next turn)"
        )
        print(
            f"stream: {second['turns']} engine turns, {second['prefilled']} prompt tokens "
            f"computed, {second['reused']} reused, {second['invalidated']} invalidated"
        )
        print(f"gold answers: {sorted(set(question.answers))}")
        if args.compare:
            compare(engine, state, args.max_tokens)
    finally:
        if engine is not None:
            engine.shutdown()


def agent_run(program, backend, question: str, max_tokens: int):
    state = program.run(question=question, max_tokens=max_tokens, backend=backend)
    state.sync()
    if state.error() is not None:
        raise state.error()
    return state


def compare(engine, state, max_tokens: int) -> None:
    """Turn 2's prompt as a plain request over the same ids, with nothing cached."""
    text, query, answer = state.text(), state["query"], state["answer"]
    before = text[: text.index(query)]  # the program's text up to each gen
    between = text[len(before) + len(query) : text.rindex(answer)]
    params = {"temperature": 0, "max_new_tokens": max_tokens}
    prompt1 = engine.tokenizer(before)["input_ids"]
    first = engine.generate(input_ids=prompt1, sampling_params=params)
    prompt2 = (
        prompt1 + first["output_ids"] + engine.tokenizer.encode(between, add_special_tokens=False)
    )
    deadline = time.monotonic() + 30  # the aborted stream's session closes meanwhile
    while not engine.flush_cache() and time.monotonic() < deadline:
        time.sleep(0.2)
    start = time.perf_counter()
    engine.generate(input_ids=prompt2, sampling_params={**params, "max_new_tokens": 1})
    ttft = time.perf_counter() - start
    plain = engine.generate(input_ids=prompt2, sampling_params=params)
    print(
        f"plain request over turn 2's {len(prompt2)} prompt ids, cache flushed: "
        f"TTFT {ttft:.3f} s; same answer: {plain['text'] == answer}"
    )


if __name__ == "__main__":  # SGLang starts its processes with spawn: keep the guard
    main()
