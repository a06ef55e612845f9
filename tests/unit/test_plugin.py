"""The plugin is SGLang's only change point; on a CPU it makes rotary embeddings native."""

from __future__ import annotations

import math
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch

from s2l_sglang import plugin
from s2l_sglang.defaults import server_argv


def test_plugin_is_registered_under_sglang_entry_point_group():
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("stream2llm") == "s2l_sglang.plugin:register"


def test_every_hook_target_resolves_in_installed_sglang():
    import pkgutil

    assert plugin.hooks(), "a CPU host needs at least the rotary hook"
    for target, fn, kind in plugin.hooks():
        owner, attr = target.rsplit(".", 1)
        assert hasattr(pkgutil.resolve_name(owner), attr), target
        assert callable(fn) and kind in {"BEFORE", "AFTER", "AROUND", "REPLACE"}


def test_every_hook_names_its_targets_parameters_as_the_target_does():
    """An SGLang upgrade that renames or reorders a hooked method's parameters fails here
    (the hook would otherwise read the wrong argument). A hook's explicit parameters, after
    `original` (AROUND) or `result` (AFTER), must be the target's leading ones."""
    import inspect
    import pkgutil

    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for target, fn, kind in plugin.hooks():
        named = [n for n, p in inspect.signature(fn).parameters.items() if p.kind in positional]
        if kind in {"AROUND", "AFTER"}:
            named = named[1:]  # original / result
        owner, attr = target.rsplit(".", 1)
        theirs = inspect.signature(getattr(pkgutil.resolve_name(owner), attr)).parameters
        theirs = [n for n, p in theirs.items() if p.kind in positional]
        assert theirs[: len(named)] == named, (target, named, theirs)


def _reference_neox_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    dim = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


_UNHOOKED_ROTARY = """
import torch
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
RotaryEmbedding(head_size=16, rotary_dim=16, max_position_embeddings=64, base=10000,
                is_neox_style=True, dtype=torch.float32)
"""


def test_rotary_embedding_builds_and_is_correct_on_cpu_only_through_the_hook():
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    args = dict(
        head_size=16,
        rotary_dim=16,
        max_position_embeddings=64,
        base=10000,
        is_neox_style=True,
        dtype=torch.float32,
    )
    # Without the hook SGLang picks a CUDA-only fallback kernel. Checked in a fresh interpreter:
    # an in-process engine started by another test may already have applied the hook here.
    unhooked = subprocess.run(
        [sys.executable, "-c", _UNHOOKED_ROTARY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert unhooked.returncode != 0 and "vllm" in unhooked.stderr, unhooked.stderr[-2000:]

    original = RotaryEmbedding.__init__

    def patched(self, **kw):
        return plugin._native_rotary_on_cpu(original, self, **kw)

    rope = RotaryEmbedding.__new__(RotaryEmbedding)
    patched(rope, **args)
    assert rope.use_fallback_kernel is False
    positions = torch.arange(5)
    q = torch.randn(5, 2 * 16)
    k = torch.randn(5, 1 * 16)
    q_out, k_out = rope.forward_native(positions, q.clone(), k.clone())
    expected_q = _reference_neox_rope(q.view(5, 2, 16), positions, 10000.0).view(5, -1)
    expected_k = _reference_neox_rope(k.view(5, 1, 16), positions, 10000.0).view(5, -1)
    assert torch.allclose(q_out, expected_q, atol=1e-5)
    assert torch.allclose(k_out, expected_k, atol=1e-5)
    assert not math.isnan(float(q_out.sum()))


def test_server_argv_adds_cpu_defaults_but_user_flags_win():
    argv = server_argv(["--model-path", "/m", "--dtype", "bfloat16", "--port=31000"])
    assert argv.count("--dtype") == 1 and argv[argv.index("--dtype") + 1] == "bfloat16"
    assert "--attention-backend" in argv and "torch_native" in argv
    assert argv.count("--model-path") == 1
    assert "--port=31000" in argv


def test_the_close_hook_publishes_only_when_configured_and_never_blocks_the_close(monkeypatch):
    """`SessionController._close`'s hook: off by config, the adapter is not reached; when the
    adapter fails, the failure is counted and SGLang's close still runs. (`controller` is a
    stand-in: the hook only passes it on; tests/integration/test_publish.py runs the real one.)"""
    from s2l_sglang import adapter
    from s2l_sglang.config import StreamConfig
    from s2l_sglang.scheduling import StreamScheduling

    controller, closed = object(), []

    def close(self, sid):
        closed.append((self, sid))

    monkeypatch.setattr(
        plugin, "_stream_sched", StreamScheduling(StreamConfig(publish_at_close=False))
    )
    monkeypatch.setattr(adapter, "publish_at_close", lambda *a: pytest.fail("published"))
    plugin._publish_closing_stream(close, controller, "s1")

    def failing_close(self, sid):  # SGLang's own error reaches its caller, after one call
        closed.append((self, sid))
        raise KeyError(sid)

    with pytest.raises(KeyError):
        plugin._publish_closing_stream(failing_close, controller, "gone")
    assert closed.pop() == (controller, "gone") and (controller, "gone") not in closed

    sched = StreamScheduling(StreamConfig())
    monkeypatch.setattr(plugin, "_stream_sched", sched)

    def broken(*args):
        raise RuntimeError("no tree")

    monkeypatch.setattr(adapter, "publish_at_close", broken)
    plugin._publish_closing_stream(close, controller, "s2")
    assert closed == [(controller, "s1"), (controller, "s2")]
    assert sched.counters.hook_errors == 1 and sched.counters.streams_published == 0


def test_the_publish_switch_handler_sets_the_config_and_never_raises(monkeypatch):
    """The scheduler's handler of `SetPublishAtCloseReq`: it switches the setting the close
    hook reads; a failure is logged and counted, and the scheduler goes on."""
    from s2l_sglang.config import StreamConfig
    from s2l_sglang.messages import SetPublishAtCloseReq
    from s2l_sglang.scheduling import StreamScheduling

    sched = StreamScheduling(StreamConfig())
    monkeypatch.setattr(plugin, "_stream_sched", sched)
    plugin._set_publish(SetPublishAtCloseReq(on=False))
    assert sched.config.publish_at_close is False and sched.export()["publish_at_close"] is False
    plugin._set_publish(SetPublishAtCloseReq(on=True))
    assert sched.config.publish_at_close is True

    def broken(on):
        raise RuntimeError("no config")

    monkeypatch.setattr(sched, "set_publish_at_close", broken)
    plugin._set_publish(SetPublishAtCloseReq(on=False))  # does not raise
    assert sched.counters.hook_errors == 1 and sched.config.publish_at_close is True
