"""Prefill-decode (PD) disaggregation: streams on the prefill instance of an SGLang PD deployment.

- `hooks`: the plugin's hooks for SGLang's PD mode (`stream_hooks`, `cpu_hooks`, listed by
  `s2l_sglang/plugin.py`);
- `final`: a stream's final turn, sent through the router (`RouterFinal`);
- `serve`: `s2l serve --pd`, prefill, decode and sglang-router on one host.

How it fits together: docs/pd.md.
"""

from s2l_sglang.pd.hooks import cpu_hooks, stream_hooks

__all__ = ["cpu_hooks", "stream_hooks"]
