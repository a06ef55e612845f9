"""stream2llm-sglang runtime: the SGLang plugin, streaming state, scheduling and the `s2l` CLI."""

__version__ = "0.1.0"
