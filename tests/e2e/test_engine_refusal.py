"""A full SGLang queue refuses a stream's background prefill turn with a 503, and the stream ends.

`s2l serve --max-running-requests 1 --max-queued-requests 1`: one long plain request runs, a
second waits. The next request SGLang receives (the stream's first turn, sent in the background
after open) is refused at `Scheduler._add_request_to_queue -> _abort_on_queued_limit`; the
stream ends with SGLang's reason, and later calls answer 409 `stream_closed` naming it. The
premise (both holders still there, one waiting) is checked, not assumed: a session note of
2026-12-01 saw a stream stay open for 120 s here, and an earlier draft of this test waited on
the truthiness of a `requests.Response` (False for any 4xx) and so never saw the stream end.
On a timeout the message carries the scheduler's counts (plain requests and streams waiting),
the holders' answers and the server log's tail.
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

LONG = {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": True}
TEXT = "The Danube flows from the Black Forest to the Black Sea through ten countries. "


def sched(calls: StreamCalls) -> dict:
    info = requests.get(f"{calls.url}/server_info", headers=calls.headers, timeout=60).json()
    return sched_counters_from(info.get("internal_states")) or {}


def wait_for(what, check, timeout=60.0, diag=lambda: ""):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; {diag()}")
        time.sleep(0.1)
    return result


def test_a_full_queue_refuses_a_streams_background_turn(tmp_path):
    log = tmp_path / "serve.log"
    argv = ["--max-running-requests", "1", "--max-queued-requests", "1", "--log-requests"]
    with serving(argv, log=log) as url:
        calls = StreamCalls(url, {"Authorization": f"Bearer {API_KEY}"})
        answers: dict[str, int] = {}

        def hold(rid: str) -> None:
            body = {"rid": rid, "text": TEXT, "sampling_params": LONG}
            answers[rid] = calls.post("/generate", body).status_code

        threads = {rid: threading.Thread(target=hold, args=(rid,), daemon=True)
                   for rid in ("hold-running", "hold-queued")}  # fmt: skip
        threads["hold-running"].start()
        wait_for("one running", lambda: sched(calls).get("running_reqs") == 1)
        threads["hold-queued"].start()
        wait_for("the queue full", lambda: (s := sched(calls)).get("running_reqs") == 1
                 and s.get("waiting_plain") == 1)  # fmt: skip
        assert not answers, f"a holder already ended: {answers}"  # the premise, not assumed

        assert calls.post("/stream/open", {"stream_id": "refused", "text": TEXT}).status_code == 200

        def diag() -> str:
            return (f"sched={sched(calls)} holders={answers} "
                    f"log_tail={log.read_text(errors='replace')[-2000:]!r}")  # fmt: skip

        def ended():  # the answer once the stream has ended (a Response is falsy for a 4xx)
            answer = calls.status("refused")
            return [answer] if answer.status_code != 200 else None

        [gone] = wait_for("the refused stream to end", ended, timeout=30.0, diag=diag)
        assert gone.status_code == 409, gone.text  # StreamClosed; its reason names the 503
        assert "queue is full" in gone.json()["error"]["message"], gone.text
        assert not answers, f"a holder ended meanwhile: {answers}"
        assert sched(calls)["open_sessions"] == 0

        for rid in threads:
            assert calls.post("/abort_request", {"rid": rid}).status_code == 200
        for t in threads.values():
            t.join(timeout=120)
            assert not t.is_alive()
