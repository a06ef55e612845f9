"""`StreamConfig`: validated at construction, split off `s2l serve`'s argv, and carried to
SGLang's processes on a real `ServerArgs` record (pickled as SGLang pickles it for its children)."""

from __future__ import annotations

import pickle

import pytest

from s2l_sglang.config import (
    StreamConfig,
    attach,
    default_host_kv_tokens,
    of_server_args,
    split_argv,
)


@pytest.mark.parametrize(
    "bad",
    [
        {"stream_policy": "fastest"},
        {"preemption": "never"},
        {"host_kv_tokens": 0},
        {"host_kv_tokens": "many"},
        {"stream_idle_timeout": -1.0},
        {"max_body_bytes": 0},
        {"speculative_reserve": -1},
        {"speculative_reserve": "half"},
    ],
)
def test_an_invalid_value_is_refused_at_construction(bad):
    with pytest.raises(ValueError):
        StreamConfig(**bad)


def test_defaults_are_valid_and_round_trip_through_a_dict():
    config = StreamConfig(stream_policy="lcas", preemption="swap", host_kv_tokens=512)
    assert StreamConfig.from_dict(config.as_dict()) == config
    with pytest.raises(ValueError, match="unknown stream settings"):
        StreamConfig.from_dict({**config.as_dict(), "stream_polcy": "fcfs"})


def test_the_default_host_pool_is_4_gib_of_the_models_kv():
    # SmolLM2-135M in bfloat16: 30 layers x K and V x 3 heads x 64 x 2 bytes
    assert default_host_kv_tokens(30 * 2 * 3 * 64 * 2) == 186_413
    # an 8B Llama in bfloat16 (32 layers, 8 KV heads of 128): vLLM's 4 GiB swap space
    assert default_host_kv_tokens(32 * 2 * 8 * 128 * 2) == 32_768


def test_serve_argv_is_split_into_ours_and_sglangs():
    argv = ["--port", "30001", "--stream-policy", "mcps", "--stream-idle-timeout=0"]
    argv += ["--stream-interval", "4", "--max-stream-body-bytes", "1024", "--dtype", "bfloat16"]
    argv += ["--stream-speculative-reserve", "2048", "--no-stream-publish-at-close"]
    config, rest = split_argv(argv)
    assert not config.publish_at_close and StreamConfig().publish_at_close
    assert config.stream_policy == "mcps"
    assert config.speculative_reserve == 2048
    assert StreamConfig().speculative_reserve is None  # automatic by default
    assert config.stream_idle_timeout is None  # 0: never
    assert config.max_body_bytes == 1024
    # SGLang's flags stay, including one that shares a prefix with ours
    assert rest == ["--port", "30001", "--stream-interval", "4", "--dtype", "bfloat16"]


def test_a_bad_serve_flag_fails_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        split_argv(["--stream-policy", "fastest"])
    assert exit_info.value.code == 2
    assert "fastest" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        split_argv(["--host-kv-tokens", "-5"])


def test_the_config_travels_on_sglangs_server_args_to_child_processes():
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy")
    assert of_server_args(server_args) == StreamConfig()  # a server not started by us
    config = StreamConfig(stream_policy="fcfs", preemption="recompute", stream_idle_timeout=3.0)
    attach(server_args, config)
    child = pickle.loads(pickle.dumps(server_args))  # what SGLang's process spawn does
    assert of_server_args(child) == config
    assert child.model_path == "dummy"


def test_the_speculative_chunk_defaults_by_device(monkeypatch):
    """256 on a CPU host (this machine), 512 on a GPU; a value given is kept. The GPU case
    fakes the device query only (`defaults.is_cpu_host`): no GPU here."""
    from s2l_sglang import defaults

    assert defaults.is_cpu_host()
    assert StreamConfig().speculative_chunk == 256
    assert split_argv([])[0].speculative_chunk == 256
    assert split_argv(["--stream-speculative-chunk", "384"])[0].speculative_chunk == 384
    monkeypatch.setattr(defaults, "is_cpu_host", lambda: False)
    assert StreamConfig().speculative_chunk == 512
    assert StreamConfig(speculative_chunk=64).speculative_chunk == 64
    config = StreamConfig()  # resolved once, where it is built: its processes get the value
    monkeypatch.undo()
    assert StreamConfig().speculative_chunk == 256
    assert StreamConfig.from_dict(config.as_dict()).speculative_chunk == 512


def test_stream_engine_leaves_the_speculative_chunk_to_the_device_default():
    import inspect

    from s2l_sglang.stream.engine import StreamEngine

    assert inspect.signature(StreamEngine).parameters["speculative_chunk"].default is None
