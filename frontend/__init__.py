"""Client side of stream2llm-sglang: the `stream_context` primitive and the HTTP client.

    from frontend import stream_context, StreamEngineBackend   # SGLang frontend language
    from frontend import StreamClient                          # async HTTP client (aiohttp)

Names load lazily: the HTTP client does not import SGLang.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "stream_context": "frontend.api",
    "SglStreamContext": "frontend.lang",
    "StreamEngineBackend": "frontend.backend",
    "StreamClient": "frontend.client",
    "Stream": "frontend.client",
    "StreamAPIError": "frontend.errors",
    "UnknownStream": "frontend.errors",
    "StreamClosed": "frontend.errors",
    "DuplicateStream": "frontend.errors",
    "EmptyChunk": "frontend.errors",
    "ContextTooLong": "frontend.errors",
    "MixedInput": "frontend.errors",
    "InvalidTokenIds": "frontend.errors",
    "BadRequest": "frontend.errors",
    "PayloadTooLarge": "frontend.errors",
    "InvalidSamplingParams": "frontend.errors",
    "InvalidStreamId": "frontend.errors",
    "ReaderStalled": "frontend.errors",
    "EngineError": "frontend.errors",
    "Forbidden": "frontend.errors",
    "Unauthorized": "frontend.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'frontend' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
