"""`stream_context(..., keep_open=True)` in SGLang programs, without an engine: a recording
backend shows which stream commands a program sends (the engine tests check the outputs)."""

from __future__ import annotations

import pytest
import sglang as sgl
from sglang.lang.backend.base_backend import BaseBackend

from frontend import stream_context
from frontend.errors import EmptyChunk


class RecordingOps:
    """`StreamOps` that record each command; finish answers "<out{n}>"."""

    def __init__(self, log: list):
        self.log = log
        self.generated_last = False

    def open(self, sid, text):
        self.log.append(("open", text))

    def append(self, sid, text):
        self.generated_last = False
        self.log.append(("append", text))

    def update(self, sid, text):
        self.generated_last = False
        self.log.append(("update", text))

    def finish(self, sid, text, sampling_params, keep_open=False):
        if self.generated_last and not text:  # as the server: a finish needs new input
            raise EmptyChunk("after a generating turn, finish needs new input", code="empty_chunk")
        self.generated_last = True
        n = sum(1 for entry in self.log if entry[0] == "finish")
        self.log.append(("finish", text, keep_open))
        return {"text": f"<out{n}>", "meta_info": {"id": sid, "stream": {"kept_open": keep_open}}}

    def finish_iter(self, sid, text, sampling_params, keep_open=False):
        out = self.finish(sid, text, sampling_params, keep_open)
        yield {"text": out["text"][:3], "meta_info": out["meta_info"]}
        yield out

    def abort(self, sid):
        self.log.append(("abort",))

    def close(self):
        self.log.append(("close",))


class RecordingBackend(BaseBackend):
    def __init__(self):
        super().__init__()
        self.log: list = []

    def stream_ops(self):
        return RecordingOps(self.log)

    def generate(self, s, sampling_params):  # a gen with no stream open
        raise AssertionError("no plain request expected")


def tool(call: str) -> str:
    return f" [tool saw {call}]"


@sgl.function
def agent(s, keep_open=True, second_keep_open=None):
    s += "Q: 6*7?"
    s += stream_context(["\nThink:"], keep_open=keep_open)
    s += sgl.gen("call", max_tokens=4)
    s += "\nResult:" + tool(s["call"])
    if second_keep_open is not None:
        s += stream_context(["\nMore:"], keep_open=second_keep_open)
    s += "\nA:"
    s += sgl.gen("answer", max_tokens=4)


@pytest.mark.parametrize("stream_output", [False, True])
def test_keep_open_gen_keeps_the_stream_and_the_next_gen_finishes_it_again(stream_output):
    backend = RecordingBackend()
    state = agent.run(backend=backend, stream=stream_output)
    if stream_output:
        "".join(state.text_iter("answer"))
    state.sync()
    assert state.error() is None, state.error()
    assert state["call"] == "<out0>" and state["answer"] == "<out1>"
    assert state.text() == "Q: 6*7?\nThink:<out0>\nResult: [tool saw <out0>]\nA:<out1>"
    assert backend.log == [
        ("open", "Q: 6*7?"),
        ("append", "\nThink:"),
        ("finish", "", True),
        ("finish", "\nResult: [tool saw <out0>]\nA:", True),  # only the text after the gen
        ("abort",),  # the program's end: the stream was left open
        ("close",),
    ]


def test_without_keep_open_the_first_gen_closes_the_stream():
    backend = RecordingBackend()
    with pytest.raises(AssertionError, match="no plain request"):
        state = agent.run(backend=backend, keep_open=False)
        state.sync()
        raise state.error()
    assert backend.log == [
        ("open", "Q: 6*7?"),
        ("append", "\nThink:"),
        ("finish", "", False),
        ("close",),  # the second gen is a plain request (refused by this backend)
    ]


def test_a_later_stream_context_streams_after_the_history_and_can_close_it():
    backend = RecordingBackend()
    state = agent.run(backend=backend, second_keep_open=False)
    state.sync()
    assert state.error() is None, state.error()
    assert backend.log == [
        ("open", "Q: 6*7?"),
        ("append", "\nThink:"),
        ("finish", "", True),
        ("append", "\nResult: [tool saw <out0>]\nMore:"),  # the text before goes with the item
        ("finish", "\nA:", False),  # keep_open=False: this gen closes the stream
        ("close",),
    ]


@sgl.function
def update_after_history(s):
    s += "Q:"
    s += stream_context([], keep_open=True)
    s += sgl.gen("call", max_tokens=4)
    s += "\nDocs:"
    s += stream_context(["first draft", ["doc a", "doc b"]], mode="update")
    s += sgl.gen("answer", max_tokens=4)


def test_update_mode_after_a_gen_replaces_only_what_follows_the_history():
    backend = RecordingBackend()
    state = update_after_history.run(backend=backend)
    state.sync()
    assert state.error() is None, state.error()
    assert state.text() == "Q:<out0>\nDocs:doc a\n\ndoc b<out1>"
    assert backend.log == [
        ("open", "Q:"),
        ("finish", "", True),
        ("update", "\nDocs:first draft"),
        ("update", "\nDocs:doc a\n\ndoc b"),
        ("finish", "", True),
        ("abort",),
        ("close",),
    ]


@sgl.function
def two_gens(s):
    s += "Q:"
    s += stream_context([], keep_open=True)
    s += sgl.gen("a", max_tokens=4)
    s += sgl.gen("b", max_tokens=4)


def test_two_gens_with_nothing_between_fail_and_abort_the_stream():
    backend = RecordingBackend()
    state = two_gens.run(backend=backend)
    state.sync()
    assert isinstance(state.error(), EmptyChunk)
    assert backend.log[-2:] == [("abort",), ("close",)]


def test_keep_open_must_be_a_bool():
    with pytest.raises(TypeError):
        stream_context([], keep_open="yes")  # type: ignore[arg-type]
