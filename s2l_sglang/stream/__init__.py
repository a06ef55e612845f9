"""Streaming-context requests: one stream id from the first chunk to the last output token."""

from s2l_sglang.stream.errors import (
    ContextTooLong,
    DuplicateStream,
    EmptyChunk,
    InvalidTokenIds,
    MixedInput,
    StreamClosed,
    StreamError,
    UnknownStream,
)
from s2l_sglang.stream.tokens import Turn, lcp, next_turn

__all__ = [
    "ContextTooLong",
    "DuplicateStream",
    "EmptyChunk",
    "InvalidTokenIds",
    "MixedInput",
    "StreamClosed",
    "StreamError",
    "Turn",
    "UnknownStream",
    "lcp",
    "next_turn",
]
