"""An engine refusal ends a stream with SGLang's own status, and nothing else is harmed.

`s2l serve --max-running-requests 1 --max-queued-requests 1`: one plain request runs, a second
waits and fills SGLang's queue, so the next request SGLang receives is refused with its 503
("The request queue is full"). That next request is a stream's prefill turn, sent in the
background after open. The stream ends at once (its session and KV freed), and its later calls
answer 503 in our error shape, not a silent open stream or a 409. Once the queue drains, a new
stream's output equals a plain request's.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from s2l_sglang.stream.manager import sched_counters_from
from tests.conftest import API_KEY, serving
from tests.helpers import StreamCalls

pytestmark = pytest.mark.engine

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
LONG = {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": True}
TEXT = "The Danube flows from the Black Forest to the Black Sea through ten countries. "
QUESTION = "\nQuestion: Where does the Danube end?\nAnswer:"


def sched(calls: StreamCalls) -> dict:
    info = requests.get(f"{calls.url}/server_info", headers=calls.headers, timeout=60).json()
    return sched_counters_from(info.get("internal_states")) or {}


def wait_for(what: str, check, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return result


def test_a_full_queue_ends_a_stream_with_sglangs_503_and_the_server_goes_on():
    argv = ["--max-running-requests", "1", "--max-queued-requests", "1"]
    with serving(argv) as url:
        calls = StreamCalls(url, {"Authorization": f"Bearer {API_KEY}"})
        holders = []
        for rid in ("hold-running", "hold-queued"):  # long plain requests: one runs, one waits
            body = {"rid": rid, "text": TEXT, "sampling_params": LONG}
            t = threading.Thread(target=calls.post, args=("/generate", body), daemon=True)
            t.start()
            holders.append(t)
            if rid == "hold-running":
                wait_for("one request running", lambda: sched(calls).get("running_reqs") == 1)
        wait_for("the queue full", lambda: sched(calls).get("waiting_reqs") == 1)

        opened = calls.post("/stream/open", {"stream_id": "refused", "text": TEXT})
        assert opened.status_code == 200, opened.text  # open only queues the prefill
        gone = wait_for("the refused stream to end", lambda: calls.status("refused").status_code
                        != 200 and calls.status("refused"))  # fmt: skip
        assert gone.status_code == 503, gone.text
        error = gone.json()["error"]
        assert error["code"] == "engine_error" and error["stream_id"] == "refused", error
        assert "queue is full" in error["message"], error
        finish = calls.post("/stream/finish", {"stream_id": "refused", "text": QUESTION})
        assert finish.status_code == 503, finish.text
        assert sched(calls)["open_sessions"] == 0  # its session and KV are gone already

        for rid in ("hold-running", "hold-queued"):
            assert calls.post("/abort_request", {"rid": rid}).status_code == 200
        for t in holders:
            t.join(timeout=120)
            assert not t.is_alive()
        wait_for("an idle engine", lambda: (s := sched(calls)).get("running_reqs") == 0
                 and s.get("waiting_reqs") == 0)  # fmt: skip

        ok = calls.post("/stream/open", {"stream_id": "after", "text": TEXT})
        assert ok.status_code == 200, ok.text
        out = calls.post(
            "/stream/finish",
            {"stream_id": "after", "text": QUESTION, "sampling_params": GREEDY, "stream": False},
        )
        assert out.status_code == 200, out.text
        ref = calls.post("/generate", {"text": TEXT + QUESTION, "sampling_params": GREEDY})
        assert out.json()["output_ids"] == ref.json()["output_ids"]
        state = wait_for("no stream left", lambda: (s := sched(calls))["open_sessions"] == 0 and s)
        assert state["session_slots"] == 0 and state["host_copies"] == 0, state
