"""Typed stream errors for what the engine raises during a turn (stream/errors.py)."""

from __future__ import annotations

from fastapi import HTTPException

from s2l_sglang.stream.errors import EngineError, StreamError, UnknownStream, engine_error


def test_an_engine_refusal_keeps_its_status():
    # SGLang's --max-queued-requests and waiting timeouts abort with an HTTPException(503)
    err = engine_error(HTTPException(status_code=503, detail="queue full"), "s1")
    assert isinstance(err, EngineError) and err.status == 503 and err.stream_id == "s1"
    assert "queue full" in str(err) and err.to_dict()["error"]["code"] == "engine_error"


def test_validation_errors_stay_400s_and_other_failures_are_500s():
    err = engine_error(ValueError("too long"), "s1")
    assert type(err) is StreamError and err.status == 400 and "too long" in str(err)
    err = engine_error(RuntimeError("boom"), "s1")
    assert isinstance(err, EngineError) and err.status == 500


def test_a_stream_error_from_below_is_relabelled_with_the_stream_id():
    inner = UnknownStream("gone", "s1.0123456789abcdef")  # named by the session key
    err = engine_error(inner, "s1")
    assert err is inner and err.stream_id == "s1"
