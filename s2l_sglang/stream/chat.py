"""Chat streams: a stream whose context is the content of one message of a chat conversation.

The stream keeps the opening messages (system and user text before the streamed one, say); one
of them, the context message, gets the streamed text as its content (append adds to it, update
replaces it). Its token ids are SGLang's own chat-template rendering of the messages with the
content so far (the renderer is set by the HTTP server from SGLang's `OpenAIServingChat`, see
`s2l_sglang/server/chat.py`); the final prompt is rendered by SGLang itself from the messages
with the question and the assistant turn added (the OpenAI-shaped finish).

Pure data and checks here: no SGLang import.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

from s2l_sglang.stream.errors import InvalidMessages


@dataclass
class ChatContext:
    """A chat stream's messages; `messages[index]["content"]` is replaced by the streamed text."""

    messages: list[dict[str, Any]]
    index: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # renders apply in call order

    def filled(self, text: str) -> list[dict[str, Any]]:
        """The messages with the context message's content = `text` (a deep copy)."""
        messages = copy.deepcopy(self.messages)
        messages[self.index]["content"] = text
        return messages


def chat_context(sid: str, messages: Any, context_message: Any = None) -> tuple[ChatContext, str]:
    """Check the opening messages; returns the context and the context message's initial text
    (its content, if it has one). `context_message` is an index (default: the last message;
    negative indexes count from the end)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidMessages("messages must be a non-empty list of message objects", sid)
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise InvalidMessages("each message must be an object with a string 'role'", sid)
    if context_message is None:
        context_message = len(messages) - 1
    if not isinstance(context_message, int) or isinstance(context_message, bool):
        raise InvalidMessages("context_message must be the index of a message", sid)
    if not -len(messages) <= context_message < len(messages):
        raise InvalidMessages(
            f"context_message {context_message} is not an index of the {len(messages)} messages",
            sid,
        )
    index = context_message % len(messages)
    content = messages[index].get("content")
    if content is not None and not isinstance(content, str):
        raise InvalidMessages("the context message's content must be a string (text)", sid)
    return ChatContext(copy.deepcopy(messages), index), content or ""
