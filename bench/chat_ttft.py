"""TTFT of a chat stream finished through the `openai` client against a plain
`/v1/chat/completions` for the same final messages, on one `s2l serve` it starts (bfloat16).

    .venv/bin/python -m bench.chat_ttft [--repeats 6] [--chunks 4] [--chars 7000]

Each repeat opens a chat stream (a system message, then a user message whose content is the
context, streamed in `--chunks` chunks 0.5 s apart), waits until its KV holds the context, and
finishes it with the question through `openai` (streamed; TTFT = first content delta); then the
plain request for the same messages. Every repeat's system message starts with a fresh nonce, so
nothing is reused from an earlier repeat. The first repeat is a warm-up (left out of the
median). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai
import orjson
import requests

from s2l_sglang.procs import free_port_block, wait_for

KEY = "bench-chat-ttft"
ROOT = Path(__file__).resolve().parents[1]
QUESTION = {"role": "user", "content": "What does the plugin hook on the scheduler?"}


def _first_token_s(stream, t0: float) -> float:
    """Seconds from `t0` (before the request was sent) to the first content delta."""
    for event in stream:
        if event.choices and event.choices[0].delta.content:
            return time.perf_counter() - t0
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chat_ttft", description=__doc__)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--chars", type=int, default=7000, help="context: this much of docs/design.md")
    args = p.parse_args(argv)
    port = free_port_block(1)
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "s2l_sglang.cli", "serve", "--host", "127.0.0.1"]
    serve += ["--port", str(port), "--api-key", KEY, "--dtype", "bfloat16", "--log-level", "error"]
    proc = subprocess.Popen(serve, start_new_session=True, cwd=ROOT)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    try:
        try:
            wait_for(proc, url + "/health", headers=headers)
        except RuntimeError as e:
            raise SystemExit(str(e)) from None
        text = (ROOT / "docs" / "design.md").read_text()[: args.chars]
        size = -(-len(text) // args.chunks)
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        streamed = openai.OpenAI(base_url=url + "/stream/v1", api_key=KEY)
        plain = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
        gen = {"model": "default", "temperature": 0, "max_tokens": 8, "stream": True}
        ttft: dict[str, list[float]] = {"stream": [], "plain": []}
        tokens = 0
        for r in range(args.repeats):
            system = {"role": "system", "content": f"Run {r}, {time.time_ns()}. Answer briefly."}
            sid = f"chat-ttft-{r}-{time.time_ns()}"
            body = {"stream_id": sid, "messages": [system, {"role": "user"}], "text": chunks[0]}
            opened = requests.post(url + "/stream/open", headers=headers, data=orjson.dumps(body))
            own = {**headers, "X-Stream-Token": opened.json()["stream_token"]}
            for chunk in chunks[1:]:
                time.sleep(0.5)
                body = {"stream_id": sid, "text": chunk}
                requests.post(url + "/stream/append", headers=own, data=orjson.dumps(body))
            while True:
                status = requests.get(f"{url}/stream/{sid}", headers=own).json()
                if status["held_tokens"] >= status["context_tokens"]:
                    tokens = status["context_tokens"]
                    break
                time.sleep(0.05)
            t0 = time.perf_counter()
            with streamed.chat.completions.create(
                messages=[QUESTION],
                extra_body={"stream_id": sid},
                extra_headers={"X-Stream-Token": own["X-Stream-Token"]},
                **gen,
            ) as events:
                ttft["stream"].append(_first_token_s(events, t0))
            other = {"role": "system", "content": f"Plain {r}, {time.time_ns()}. Answer briefly."}
            final = [other, {"role": "user", "content": text}, QUESTION]
            t0 = time.perf_counter()
            with plain.chat.completions.create(messages=final, **gen) as events:
                ttft["plain"].append(_first_token_s(events, t0))
        out = {
            "command": "python -m bench.chat_ttft " + " ".join(argv or sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "context_tokens": tokens,
            "load_average": os.getloadavg(),
            **{k: {"median_s": statistics.median(v[1:]), "all_s": v} for k, v in ttft.items()},
        }
        print(json.dumps(out))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
