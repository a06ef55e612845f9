"""Stream routes over real HTTP against the real engine: output, SSE format, bad input."""

from __future__ import annotations

import time

import orjson
import pytest
import requests

from tests.helpers import fresh_salt

GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
CONTEXT = (
    "The Rhine is a European river that begins in the Swiss canton of Graubunden and flows "
    "through Switzerland, Liechtenstein, Austria, Germany, France and the Netherlands. "
)
QUESTION = "\nQuestion: Where does the Rhine begin?\nAnswer:"


def post(server, route: str, body=None, raw: bytes | None = None, headers=None, **kw):
    """A stream-route call with the API key and, for a stream opened here, its token."""
    return server.post(route, body, raw=raw, headers=headers, timeout=120, **kw)


def sse_events(resp) -> list:
    events = []
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            payload = line[len(b"data: ") :]
            events.append(payload if payload == b"[DONE]" else orjson.loads(payload))
    return events


def reference_ids(server, text: str) -> list[int]:
    body = {"text": text, "sampling_params": GREEDY, "cache_salt": fresh_salt()}
    resp = post(server, "/generate", body)
    assert resp.status_code == 200, resp.text
    return resp.json()["output_ids"]


def test_append_and_update_over_http_equal_non_streaming(server):
    assert (
        post(
            server,
            "/stream/open",
            {"stream_id": "h-append", "sampling_params": GREEDY, "text": CONTEXT[:40]},
        ).status_code
        == 200
    )
    assert post(server, "/stream/append", {"stream_id": "h-append", "text": CONTEXT[40:]}).ok
    resp = post(server, "/stream/finish", {"stream_id": "h-append", "text": QUESTION}, stream=True)
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp)
    assert events[-1] == b"[DONE]"
    final = events[-2]
    assert final["meta_info"]["id"] == "h-append" and "ttft_s" in final["meta_info"]["stream"]
    assert final["output_ids"] == reference_ids(server, CONTEXT + QUESTION)

    post(
        server,
        "/stream/open",
        {
            "stream_id": "h-update",
            "sampling_params": GREEDY,
            "text": "An unrelated first draft. " + CONTEXT,
        },
    )
    # the first draft's KV must be there for the update to invalidate any: wait for it
    deadline = time.monotonic() + 120
    while (st := server.status("h-update").json())["held_tokens"] < st["context_tokens"]:
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    assert post(
        server, "/stream/update", {"stream_id": "h-update", "documents": [CONTEXT, "Second doc."]}
    ).ok
    out = post(
        server, "/stream/finish", {"stream_id": "h-update", "text": QUESTION, "stream": False}
    ).json()
    assert out["output_ids"] == reference_ids(server, CONTEXT + "\n\nSecond doc." + QUESTION)
    assert out["meta_info"]["stream"]["invalidated"] > 0


def test_one_connection_ndjson_stream(server):
    lines = [
        {"op": "open", "sampling_params": GREEDY},
        {"op": "append", "text": CONTEXT[:70]},
        {"op": "append", "text": CONTEXT[70:]},
        {"op": "finish", "text": QUESTION},
    ]

    def body():
        for line in lines:
            yield orjson.dumps(line) + b"\n"
            time.sleep(0.2)

    resp = post(server, "/stream", raw=body(), stream=True)  # chunked request body
    events = sse_events(resp)
    assert events[-1] == b"[DONE]"
    assert events[-2]["output_ids"] == reference_ids(server, CONTEXT + QUESTION)


def test_a_dropped_ndjson_connection_ends_its_stream_without_a_traceback(server, server_log):
    """The client goes away in the middle of the command lines: the stream is aborted (KV
    freed) and the server logs no traceback for it."""
    import socket

    from tests.conftest import API_KEY

    start = server_log.stat().st_size
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            f"POST /stream HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
            "Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )
        for line in (
            {"op": "open", "stream_id": "h-drop", "sampling_params": GREEDY},
            {"op": "append", "text": CONTEXT},
        ):
            data = orjson.dumps(line) + b"\n"
            sock.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        deadline = time.monotonic() + 60
        while server.status("h-drop").status_code != 403:  # open: only its connection may act
            assert time.monotonic() < deadline, "the stream never opened"
            time.sleep(0.1)
    deadline = time.monotonic() + 60
    while (status := server.status("h-drop")).status_code != 409:  # ended with the connection
        assert time.monotonic() < deadline, status.text
        time.sleep(0.1)
    assert "disconnect" in status.json()["error"]["message"], status.text
    logged = server_log.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in logged and "Exception in ASGI" not in logged, logged[-3000:]


def test_one_connection_refuses_a_finish_that_keeps_the_stream_open(server):
    lines = [{"op": "open", "text": CONTEXT}, {"op": "finish", "keep_open": True}]
    raw = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    resp = post(server, "/stream", raw=raw)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "bad_request" and "keep_open" in error["message"]
    # the stream was aborted with the connection (its KV freed), not left open
    status = server.status(error["stream_id"])
    assert status.status_code == 409


@pytest.mark.parametrize(
    ("route", "raw", "status", "code"),
    [
        ("/stream/append", b"{not json", 400, "bad_request"),
        ("/stream/append", b"[1, 2]", 400, "bad_request"),
        ("/stream/append", b'{"stream_id": "x", "text": 5}', 400, "bad_request"),
        ("/stream/append", b'{"text": "no id"}', 400, "bad_request"),
        ("/stream/append", b'{"stream_id": "nope", "text": "hi"}', 404, "unknown_stream"),
        ("/stream/finish", b'{"stream_id": "nope"}', 404, "unknown_stream"),
        ("/stream/abort", b'{"stream_id": "nope"}', 404, "unknown_stream"),
        ("/stream/update", b'{"stream_id": "x", "documents": [1]}', 400, "bad_request"),
    ],
)
def test_bad_requests_get_4xx_json_errors(server, route, raw, status, code):
    resp = post(server, route, raw=raw)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == code


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ({"sampling_params": {"no_such_parameter": 1}}, "invalid_sampling_params", "unknown"),
        ({"sampling_params": {"stop": 5}}, "invalid_sampling_params", "'stop'"),
        ({"sampling_params": {"max_new_tokens": "x"}}, "invalid_sampling_params", "max_new"),
        ({"sampling_params": {"temperature": -1}}, "invalid_sampling_params", "temperature"),
        ({"sampling_params": {"n": 2}}, "invalid_sampling_params", "n must be 1"),
        ({"sampling_params": "greedy"}, "bad_request", "sampling_params"),
        ({"stream_id": "a/b"}, "invalid_stream_id", "a/b"),
        ({"stream_id": "a b"}, "invalid_stream_id", "a b"),
        ({"txt": "a typo"}, "bad_request", "unknown field 'txt'"),
        ({"input_ids": [1, True]}, "bad_request", "input_ids"),
        ({"context_message": 0}, "bad_request", "messages"),
    ],
)
def test_bad_open_is_refused_before_anything_opens(server, body, code, says):
    resp = post(server, "/stream/open", dict({"text": "Hi."}, **body))
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and says in error["message"], error
    if isinstance(body.get("stream_id"), str) and "/" not in body["stream_id"]:
        status = server.status(body["stream_id"])
        assert status.status_code == 404  # nothing was opened


def test_unknown_stream_paths_answer_in_our_error_shape(server):
    for path in ("/stream/a/b", "/stream/no/such/route"):
        resp = requests.get(f"{server.url}{path}", headers=server.headers, timeout=30)
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "not_found"
    resp = requests.get(f"{server.url}/stream/append", headers=server.headers, timeout=30)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "unknown_stream"
    resp = requests.put(f"{server.url}/stream/open", headers=server.headers, timeout=30)
    assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"
    # SGLang's own routes keep SGLang's shape
    resp = requests.get(f"{server.url}/no_such_sglang_route", headers=server.headers, timeout=30)
    assert resp.status_code == 404 and not isinstance(resp.json().get("error"), dict)


@pytest.mark.parametrize("as_events", [True, False])
@pytest.mark.parametrize(
    "params", [{"no_such_parameter": 1}, {"stop": 5}, {"max_new_tokens": "x"}, {"n": 2}]
)
def test_bad_finish_params_get_a_400_and_the_stream_goes_on(server, params, as_events):
    sid = f"h-params-{abs(hash((str(params), as_events))) % 10**8}"
    post(server, "/stream/open", {"stream_id": sid, "sampling_params": GREEDY, "text": CONTEXT})
    body = {"stream_id": sid, "text": QUESTION, "sampling_params": params, "stream": as_events}
    bad = post(server, "/stream/finish", body)
    assert bad.status_code == 400, bad.text  # was a 500, or a 200 event stream cut off
    assert bad.json()["error"]["code"] == "invalid_sampling_params"
    good = post(server, "/stream/finish", {"stream_id": sid, "text": QUESTION, "stream": False})
    assert good.status_code == 200, good.text
    assert good.json()["output_ids"] == reference_ids(server, CONTEXT + QUESTION)


def test_an_event_stream_finish_that_fails_first_gets_a_4xx(server):
    post(server, "/stream/open", {"stream_id": "h-empty", "sampling_params": GREEDY})
    resp = post(server, "/stream/finish", {"stream_id": "h-empty"}, stream=True)
    assert resp.status_code == 400, resp.text  # was 200 with an error event
    assert resp.json()["error"]["code"] == "empty_chunk"
    body = {"stream_id": "h-temp", "sampling_params": GREEDY, "text": CONTEXT}
    post(server, "/stream/open", body)
    bad = {"stream_id": "h-temp", "text": QUESTION, "sampling_params": {"temperature": -1}}
    resp = post(server, "/stream/finish", bad, stream=True)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_sampling_params"
    post(server, "/stream/abort", {"stream_id": "h-temp"})


def test_stream_state_errors_and_others_keep_going(server):
    post(server, "/stream/open", {"stream_id": "h-bad", "sampling_params": GREEDY, "text": "Hi."})
    dup = post(server, "/stream/open", {"stream_id": "h-bad"})
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "duplicate_stream"
    empty = post(server, "/stream/append", {"stream_id": "h-bad", "text": ""})
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_chunk"
    big = post(server, "/stream/append", {"stream_id": "h-bad", "text": "word " * 9000})
    assert big.status_code == 413 and big.json()["error"]["code"] == "context_too_long"
    after = post(server, "/stream/append", {"stream_id": "h-bad", "text": "more"})
    assert after.status_code == 409 and after.json()["error"]["code"] == "stream_closed"
    oversize = post(
        server, "/stream/append", raw=b'{"stream_id": "h-bad", "text": "' + b"a" * (9 << 20) + b'"}'
    )
    assert oversize.status_code == 413
    # the server keeps serving other streams
    post(server, "/stream/open", {"stream_id": "h-ok", "sampling_params": GREEDY, "text": CONTEXT})
    out = post(server, "/stream/finish", {"stream_id": "h-ok", "text": QUESTION, "stream": False})
    assert out.status_code == 200 and out.json()["output_ids"]
    status = server.status("h-ok")
    assert status.status_code == 409


def test_api_key_is_required_on_stream_routes(server):
    body = {"stream_id": "h-auth", "text": "x"}
    assert post(server, "/stream/open", body, headers={}).status_code == 401
    wrong = {"Authorization": "Bearer wrong"}
    assert post(server, "/stream/open", body, headers=wrong).status_code == 401
    missing = requests.get(f"{server.url}/stream/h-auth", timeout=30)
    assert missing.status_code == 401


def test_client_disconnect_during_output_aborts_the_stream(server):
    long = dict(GREEDY, max_new_tokens=400)
    post(server, "/stream/open", {"stream_id": "h-gone", "sampling_params": long, "text": CONTEXT})
    resp = post(server, "/stream/finish", {"stream_id": "h-gone", "text": QUESTION}, stream=True)
    next(resp.iter_lines())  # first event arrives, then the client goes away
    resp.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = server.status("h-gone")
        if status.status_code == 409:
            break
        time.sleep(0.2)
    assert status.status_code == 409
    # aborted for the disconnect, not finished (400 tokens would also end it, later)
    assert "client disconnected" in status.json()["error"]["message"], status.json()


def test_a_large_chunk_is_tokenized_off_the_event_loop(server):
    """The server answers other calls while a 1 MB chunk is tokenized: tokenized on the event
    loop, every other request waited for the whole of it."""
    import threading

    assert post(server, "/stream/open", {"stream_id": "h-big", "sampling_params": GREEDY}).ok
    done, result = threading.Event(), {}

    def append():
        chunk = {"stream_id": "h-big", "text": "word " * 200_000}  # 1,000,000 characters
        result["resp"] = post(server, "/stream/append", chunk)
        done.set()

    thread = threading.Thread(target=append)
    thread.start()
    answered = 0
    while not done.is_set():
        info = requests.get(f"{server.url}/stream/h-nobody", headers=server.headers, timeout=60)
        answered += info.status_code == 404 and not done.is_set()
    thread.join()
    # far beyond the model's context: refused after tokenizing, the stream aborted
    assert result["resp"].status_code == 413, result["resp"].text
    assert answered >= 3, answered


def test_idle_stream_times_out_over_http(server):
    post(server, "/stream/open", {"stream_id": "h-idle", "text": "Hello."})
    deadline = time.monotonic() + 120  # the server's idle timeout is 3 s: wait for its reaper
    while server.status("h-idle").status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    resp = post(server, "/stream/append", {"stream_id": "h-idle", "text": "late"})
    assert resp.status_code == 409 and "idle" in resp.json()["error"]["message"]


def _sched_state(server) -> dict:
    info = requests.get(f"{server.url}/server_info", headers=server.headers, timeout=30).json()
    states = [s["s2l_sched"] for s in info["internal_states"] if "s2l_sched" in s]
    assert len(states) == 1, info["internal_states"]
    return states[0]


def test_serve_flags_reach_the_scheduler_and_the_policy_switches_over_http(server):
    state = _sched_state(server)
    assert state["preemption"] == "recompute"  # `--preemption recompute` of the fixture
    assert state["policy"] == "default"
    try:
        resp = post(server, "/stream/policy", {"policy": "fcfs"})
        assert resp.status_code == 200 and resp.json() == {"policy": "fcfs"}
        assert _sched_state(server)["policy"] == "fcfs"
        bad = post(server, "/stream/policy", {"policy": "fastest"})
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "bad_request"
        assert "fastest" in bad.json()["error"]["message"]
        assert post(server, "/stream/policy", {"policy": "fcfs"}, headers={}).status_code == 401
    finally:
        post(server, "/stream/policy", {"policy": "default"})
    assert _sched_state(server)["policy"] == "default"


def test_token_id_chunks_over_http_equal_a_plain_request(server):
    tokenize = post(server, "/tokenize", {"prompt": CONTEXT + QUESTION})  # SGLang's own route
    assert tokenize.status_code == 200, tokenize.text
    ids = tokenize.json()["tokens"]
    sid = "http-ids"
    opened = post(server, "/stream/open", {"stream_id": sid, "sampling_params": GREEDY})
    assert opened.status_code == 200
    assert post(server, "/stream/append", {"stream_id": sid, "input_ids": ids[:20]}).ok
    mixed = post(server, "/stream/append", {"stream_id": sid, "text": "words"})
    assert mixed.status_code == 400 and mixed.json()["error"]["code"] == "mixed_input"
    bad = post(server, "/stream/append", {"stream_id": sid, "input_ids": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input_ids"
    body = {"stream_id": sid, "input_ids": ids[20:], "stream": False}
    final = post(server, "/stream/finish", body)
    assert final.status_code == 200, final.text
    body = {"input_ids": ids, "sampling_params": GREEDY, "cache_salt": fresh_salt()}
    ref = post(server, "/generate", body)
    assert final.json()["output_ids"] == ref.json()["output_ids"]


def _routed(server, command: dict, key: str | None = "same", **body) -> requests.Response:
    """A stream command in the form sglang-router proxies: `/generate` with session_params.s2l
    and the routing key header (`same`: the command's stream id)."""
    headers = dict(server.headers)
    if key is not None:
        headers["x-smg-routing-key"] = command.get("stream_id") if key == "same" else key
    return requests.post(
        f"{server.url}/generate",
        json={"session_params": {"s2l": command}, **body},
        headers=headers,
        timeout=120,
    )


def test_stream_commands_carried_by_generate_equal_the_stream_routes(server):
    """The `/generate` form (server/routed.py): the same commands, answers and errors."""
    sid = "h-routed"
    opened = _routed(
        server, {"op": "open", "stream_id": sid, "sampling_params": GREEDY, "text": CONTEXT[:40]}
    )
    assert opened.status_code == 200, opened.text
    token = opened.json()["stream_token"]
    # the stream's token travels in the body (the router drops X-Stream-Token) and is checked
    append = {"op": "append", "stream_id": sid, "text": CONTEXT[40:]}
    denied = _routed(server, {**append, "stream_token": "not-the-token"})
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
    assert _routed(server, {**append, "stream_token": token}).status_code == 200
    status = _routed(server, {"op": "status", "stream_id": sid, "stream_token": token})
    assert status.status_code == 200 and status.json()["stream_id"] == sid
    # refused, and nothing else happens to the stream: no routing key, a wrong one, a chunk
    # outside the command, another session_params key, an unknown field
    for resp in (
        _routed(server, {"op": "status", "stream_id": sid, "stream_token": token}, key=None),
        _routed(server, {"op": "status", "stream_id": sid, "stream_token": token}, key="other"),
        _routed(server, {"op": "status", "stream_id": sid, "stream_token": token}, text="x"),
        _routed(server, {"op": "status", "stream_id": sid, "stream_token": token, "text": "x"}),
        _routed(server, {"op": "append", "stream_id": sid, "stream_token": token, "txt": "x"}),
        _routed(server, {"op": "close", "stream_id": sid}),
    ):
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "bad_request", resp.text
    oversize = {"op": "append", "stream_id": sid, "stream_token": token, "text": "a" * (9 << 20)}
    too_large = _routed(server, oversize)
    assert too_large.status_code == 413, too_large.text[:300]
    assert too_large.json()["error"]["code"] == "payload_too_large"
    finish = {"op": "finish", "stream_id": sid, "stream_token": token, "text": QUESTION}
    resp = requests.post(
        f"{server.url}/generate",
        json={"session_params": {"s2l": finish}},
        headers={**server.headers, "x-smg-routing-key": sid},
        timeout=120,
        stream=True,
    )
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp)
    assert events[-1] == b"[DONE]" and events[-2]["meta_info"]["id"] == sid
    assert events[-2]["output_ids"] == reference_ids(server, CONTEXT + QUESTION)
    gone = _routed(server, {"op": "status", "stream_id": sid, "stream_token": token})
    assert gone.status_code in (404, 409), gone.text


def test_plain_generate_requests_are_untouched_by_the_command_form(server):
    """A plain request that mentions "s2l", or has other session_params, is SGLang's as before."""
    text = 'The key "s2l" is a stream command only inside session_params.'
    resp = requests.post(
        f"{server.url}/generate",
        json={"text": text, "sampling_params": GREEDY},
        headers=server.headers,
        timeout=120,
    )
    assert resp.status_code == 200 and len(resp.json()["output_ids"]) == GREEDY["max_new_tokens"]
    # SGLang's own answer to a session it does not know, not ours
    resp = requests.post(
        f"{server.url}/generate",
        json={"text": text, "sampling_params": GREEDY, "session_params": {"id": "no-such"}},
        headers=server.headers,
        timeout=120,
    )
    assert "s2l" not in resp.text and "x-smg-routing-key" not in resp.text
