"""Fuzzing the stream routes over HTTP: no 5xx, no 200 that carries an error, nothing harmed.

Hypothesis draws bodies for every stream route from the fields the routes know (server/bodies.py,
the OpenAPI schema the routes publish) and from fields they do not, with values of every JSON
type; a drawn stream id is often a live stream's, so that the calls reach the manager and the
engine rather than stopping at "unknown stream". After each case the stream is aborted if it is
still open; the module fixture `no_stream_left_behind` then checks that no session, KV slot or
host copy is left. The case count is printed (`-s`) and kept in docs/robustness.md.
"""

from __future__ import annotations

import uuid

import orjson
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROUTES = ("open", "append", "update", "finish", "abort")
FIELDS = (
    "stream_id",
    "text",
    "input_ids",
    "documents",
    "sampling_params",
    "stream",
    "keep_open",
    "messages",
    "context_message",
)
SAMPLING = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "n", "ignore_eos", "nope")
CASES = {"count": 0, "status": {}, "codes": {}}

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
# generation stays short: a drawn max_new_tokens is small, or not an integer at all
valid_sampling = st.fixed_dictionaries(
    {},
    optional={
        "max_new_tokens": st.integers(0, 4),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.05, 1),
        "top_k": st.integers(-1, 50),
        "stop": st.one_of(
            st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1), max_size=2)
        ),
        "ignore_eos": st.booleans(),
    },
)
sampling = st.one_of(
    valid_sampling,
    valid_sampling,
    st.dictionaries(
        st.sampled_from(SAMPLING), st.one_of(st.integers(-3, 4), json_scalar), max_size=4
    ),
)


def mostly_valid(valid, junk=json_value):
    """Three draws in four of the field's own type (so that calls reach the manager and the
    engine), the fourth anything at all."""
    return st.one_of(valid, valid, valid, junk)


message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"])},
    optional={"content": st.text(max_size=20)},
)
#: values of each field's own type (a drawn stream id is the live stream's)
typed_values = {
    "stream_id": st.just("LIVE"),
    "text": st.text(max_size=60),
    "input_ids": st.lists(st.integers(0, 49151), max_size=8),
    "documents": st.lists(st.text(max_size=20), max_size=3),
    "sampling_params": valid_sampling,
    "stream": st.booleans(),
    "keep_open": st.booleans(),
    "messages": st.lists(message, min_size=1, max_size=3),
    "context_message": st.integers(-3, 3),
}
field_values = {
    "stream_id": mostly_valid(st.just("LIVE"), st.one_of(st.text(max_size=12), json_scalar)),
    "sampling_params": mostly_valid(sampling),
    **{
        k: mostly_valid(v)
        for k, v in typed_values.items()
        if k not in ("stream_id", "sampling_params")
    },
}


#: the fields each route takes (server/bodies.py); a drawn body mostly keeps to them
ROUTE_FIELDS = {
    "open": ("stream_id", "text", "input_ids", "sampling_params", "messages", "context_message"),
    "append": ("stream_id", "text", "input_ids"),
    "update": ("stream_id", "text", "input_ids", "documents"),
    "finish": ("stream_id", "text", "input_ids", "sampling_params", "stream", "keep_open"),
    "abort": ("stream_id",),
}


@st.composite
def bodies(draw, route: str) -> dict:
    own = st.sampled_from(ROUTE_FIELDS[route])
    names = draw(
        st.lists(st.one_of(own, own, own, st.sampled_from(FIELDS)), unique=True, max_size=4)
    )
    body = {name: draw(field_values[name]) for name in names}
    if "stream_id" not in body and draw(st.integers(0, 9)) > 0:
        body["stream_id"] = "LIVE"
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(min_size=1, max_size=8))] = draw(json_value)  # an unknown field
    return body


@st.composite
def typed_bodies(draw, route: str) -> dict:
    """Bodies of the route's own fields with values of their own types: calls that pass the
    edge's checks and reach the manager and the engine."""
    names = draw(st.lists(st.sampled_from(ROUTE_FIELDS[route]), unique=True, max_size=4))
    body = {name: draw(typed_values[name]) for name in names if name != "stream_id"}
    body["stream_id"] = "LIVE"
    return body


def _check(resp: requests.Response, events: bool) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if resp.status_code != 200:
        error = resp.json()["error"]
        assert isinstance(error, dict) and error["code"] and error["message"], error
        CASES["codes"][error["code"]] = CASES["codes"].get(error["code"], 0) + 1
        return
    if events:
        for line in resp.iter_lines():
            assert not line.startswith(b'data: {"error"'), line[:300]
    else:
        assert "error" not in resp.json(), resp.text[:300]


def _one_case(server, route: str, body: dict, live_text: bool) -> None:
    """Open a live stream, send the drawn call, check the answer, clean up."""
    live = f"fuzz-{uuid.uuid4().hex[:10]}"
    opened = server.post(
        "/stream/open",
        {
            "stream_id": live,
            "text": "Fuzzing the stream routes." if live_text else "",
            "sampling_params": {"max_new_tokens": 4},
        },
    )
    assert opened.status_code == 200, opened.text
    if body.get("stream_id") == "LIVE":
        body["stream_id"] = live
    raw = orjson.dumps(body)
    as_events = route == "finish" and body.get("stream", True) is not False
    resp = server.post(f"/stream/{route}", raw=raw, headers=server.for_stream(live), stream=True)
    _check(resp, as_events)
    CASES["count"] += 1
    CASES["status"][resp.status_code] = CASES["status"].get(resp.status_code, 0) + 1
    for sid in {live, body.get("stream_id")}:
        if isinstance(sid, str) and sid in server.tokens:
            server.post("/stream/abort", {"stream_id": sid})  # 404/409 once it has ended


FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.timeout(900)
@FUZZ
@given(
    case=st.sampled_from(ROUTES).flatmap(lambda r: st.tuples(st.just(r), bodies(r))),
    live_text=st.booleans(),
)
def test_fuzzed_stream_calls_get_a_4xx_or_a_clean_200(server, case, live_text):
    _one_case(server, *case, live_text)


@pytest.mark.timeout(900)
@settings(FUZZ, max_examples=200)
@given(
    case=st.sampled_from(ROUTES).flatmap(lambda r: st.tuples(st.just(r), typed_bodies(r))),
    live_text=st.booleans(),
)
def test_well_typed_stream_calls_get_a_4xx_or_a_clean_200(server, case, live_text):
    _one_case(server, *case, live_text)


def test_fuzz_cases_ran_and_the_server_is_healthy(server):
    """Runs after the fuzz test (file order): the cases ran, and the server still serves."""
    assert CASES["count"] >= 400, CASES
    statuses, codes = sorted(CASES["status"].items()), sorted(CASES["codes"].items())
    print(f"fuzz: {CASES['count']} cases, statuses {statuses}, error codes {codes}")
    resp = requests.get(f"{server.url}/health", headers=server.headers, timeout=60)
    assert resp.status_code == 200
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 2}}
    out = requests.post(f"{server.url}/generate", json=body, headers=server.headers, timeout=120)
    assert out.status_code == 200 and out.json()["output_ids"]
