"""Chat streams without an engine: message checks, the context filled in, the finish hook's
pass-through, and the manager's chat turns over a fake tokenizer manager and renderer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from s2l_sglang.server import chat as server_chat
from s2l_sglang.stream.chat import ChatContext, chat_context
from s2l_sglang.stream.errors import InvalidMessages, StreamClosed, UnknownStream

SYSTEM = {"role": "system", "content": "Be brief."}


def test_chat_context_defaults_to_the_last_message_and_keeps_its_content():
    chat, initial = chat_context("s", [SYSTEM, {"role": "user", "content": "Docs: "}])
    assert chat.index == 1 and initial == "Docs: "
    filled = chat.filled("Docs: one two")
    assert filled == [SYSTEM, {"role": "user", "content": "Docs: one two"}]
    assert chat.messages[1]["content"] == "Docs: "  # a copy: the stored messages are unchanged
    chat, initial = chat_context("s", [SYSTEM, {"role": "user"}, {"role": "user"}], -2)
    assert chat.index == 1 and initial == ""


@pytest.mark.parametrize(
    ("messages", "index"),
    [
        ([], None),
        ("hello", None),
        ([{"content": "no role"}], None),
        ([SYSTEM], 1),
        ([SYSTEM], -2),
        ([SYSTEM], True),
        ([{"role": "user", "content": [{"type": "text", "text": "parts"}]}], 0),
    ],
)
def test_chat_context_refuses_bad_messages(messages, index):
    with pytest.raises(InvalidMessages):
        chat_context("s", messages, index)


def test_finish_hook_passes_other_requests_through():
    calls = []

    def original(tm, obj, *args, **kwargs):
        calls.append(obj.rid)
        return "original"

    obj = SimpleNamespace(rid="plain-request")
    assert server_chat.final_generate_request(original, None, obj, None) == "original"
    server_chat._claims["x::s2l-final"] = server_chat.Claim("x", 0.0)
    try:
        assert server_chat.final_generate_request(original, None, obj, None) == "original"
        claimed = SimpleNamespace(rid="x::s2l-final", stream=False)
        gen = server_chat.final_generate_request(original, None, claimed, None)
        assert hasattr(gen, "__anext__") and "x::s2l-final" not in server_chat._claims
        asyncio.run(gen.aclose())
    finally:
        server_chat._claims.clear()
    assert calls == ["plain-request", "plain-request"]


def test_prompt_ids_of_sglang_request():
    ids = SimpleNamespace(input_ids=[1, 2, 3], text=None, image_data=None)
    assert server_chat.prompt_ids_of(ids, None) == [1, 2, 3]
    text = SimpleNamespace(input_ids=None, text="ab", image_data=None)
    assert server_chat.prompt_ids_of(text, lambda t: [ord(c) for c in t]) == [97, 98]
    with pytest.raises(ValueError):
        server_chat.prompt_ids_of(SimpleNamespace(input_ids=[1], image_data=["x"]), None)


class FakeTM:
    """A fake (no engine runs here): just enough of SGLang's TokenizerManager for the
    manager's turns. Its sampling-parameter class is SGLang's own."""

    from sglang.srt.sampling.sampling_params import SamplingParams as sampling_params_class

    context_len = 1000
    tokenizer = None
    model_config = SimpleNamespace(vocab_size=1000)

    def __init__(self):
        self.turns = []
        self.sent = []  # messages to the scheduler (CancelStaleTurnReq)

    def _dispatch_to_scheduler(self, obj):
        self.sent.append(obj)

    async def open_session(self, obj):
        return obj.session_id

    async def close_session(self, obj):
        pass

    def abort_request(self, rid):
        pass

    async def generate_request(self, obj, request=None):
        self.turns.append(obj)
        yield {"meta_info": {"prompt_tokens": 0, "cached_tokens": 0}}


def render(messages):
    """A toy chat template: role and content characters, a closing token, an assistant
    prompt (what a real template's closing tokens look like after the context)."""
    ids = []
    for m in messages:
        ids += [1] + [ord(c) for c in m.get("content") or ""] + [2]
    return ids + [3]


def test_manager_chat_stream_turns():
    from s2l_sglang.stream.manager import StreamManager

    async def run():
        tm = FakeTM()
        mgr = StreamManager(tm)
        mgr.chat_renderer = render
        await mgr.open_chat("c", [SYSTEM, {"role": "user"}], text="ab")
        await mgr.append("c", "cd")
        while mgr.streams["c"].pump and not mgr.streams["c"].pump.done():
            await asyncio.sleep(0)
        await mgr.streams["c"].pump
        stream = mgr.streams["c"]
        assert stream.text == "abcd" and stream.ids == render(stream.chat.filled("abcd"))
        assert stream.held == stream.ids
        await mgr.update("c", "xy")
        await mgr.streams["c"].pump
        assert mgr.streams["c"].held == render(stream.chat.filled("xy"))
        with pytest.raises(Exception) as err:  # the plain finish is refused
            await mgr.finish("c")
        assert err.value.code == "chat_stream"
        messages = mgr.reserve_chat_finish("c")
        assert messages[1] == {"role": "user", "content": "xy"}
        with pytest.raises(StreamClosed):  # reserved: no more chunks
            await mgr.append("c", "z")
        mgr.release_chat_finish("c")
        await mgr.append("c", "z")
        with pytest.raises(UnknownStream):
            mgr.reserve_chat_finish("nope")
        await mgr.abort("c")

    asyncio.run(run())


def test_chat_context_is_plain_data():
    chat = ChatContext([{"role": "user", "content": None}], 0)
    assert chat.filled("t") == [{"role": "user", "content": "t"}]
