"""`speculative_chunk` from measured prefills: the rule (`chunk_for_step`), a saved profile
that records its prefill step (`CostModel.speculative_chunk`), and `with_measured_chunk`,
which a server or engine applies at start on a real `ServerArgs` record when the chunk was not
given. The engine side (`s2l profile` recording the step, both processes using the chunk) is
in tests/integration/test_measured_chunk.py."""

from __future__ import annotations

import pytest
from sglang.srt.server_args import ServerArgs

from s2l_sglang.config import StreamConfig, split_argv, with_measured_chunk
from s2l_sglang.sched.costmodel import (
    CostModel,
    ProfileStore,
    chunk_for_step,
    key_of_server_args,
)

#: prefill-only requests, seconds by tokens (bench.prefill_probe): the AMX Xeon in bfloat16
#: (bench/results/prefill_probe-9b11d6f-run1.json, step 512) and a 2-core AMD EPYC without
#: AVX-512 in float32 (2026-12-07, step 1024)
XEON_BF16 = {16: 0.067, 64: 0.08, 128: 0.099, 256: 0.138, 384: 0.165, 512: 0.2}
EPYC_FP32 = {16: 0.278, 64: 0.382, 128: 0.555, 256: 0.87, 512: 1.732, 1024: 3.565}


@pytest.mark.parametrize(
    ("points", "page", "step_tokens", "chunk"),
    [
        # twice 67 ms at 243 tokens: 256, the chunk that A/B runs chose there
        (XEON_BF16, 1, 512, 256),
        # twice 278 ms at 128 tokens (just past it): 192
        (EPYC_FP32, 1, 1024, 192),
        # a multiple of both 64 and the page size
        (XEON_BF16, 16, 512, 256),
        (XEON_BF16, 96, 512, 384),
        # at most the serving engine's step (rounded down to whole units)
        (EPYC_FP32, 1, 150, 128),
        # no size measured takes twice the smallest (a GPU's small steps): the largest measured
        ({16: 0.015, 1024: 0.016, 4096: 0.02}, 1, 8192, 4096),
        ({16: 0.015, 1024: 0.016, 4096: 0.02}, 1, None, 4096),
        # a step dearer than twice the smallest at once: the smallest unit
        ({16: 0.1, 32: 0.5}, 1, 512, 64),
    ],
)
def test_the_chunk_takes_twice_the_smallest_prefill(points, page, step_tokens, chunk):
    assert chunk_for_step(points.items(), page, step_tokens) == chunk


def test_no_chunk_from_fewer_than_two_points_or_no_time():
    assert chunk_for_step([(16, 0.1)]) is None
    assert chunk_for_step([(16, 0.0), (64, 0.1)]) is None


def test_a_profile_gives_a_chunk_only_if_it_recorded_its_step(tmp_path):
    key = key_of_server_args(_args())
    model = CostModel.fit(EPYC_FP32.items(), [(16, 0.002), (4096, 0.02)], key, 512)
    loaded = ProfileStore(tmp_path).find(key) if ProfileStore(tmp_path).save(model) else None
    assert loaded.step_tokens == 512
    # its points up to 512 tokens took one step each; the serving engine's step bounds the chunk
    assert loaded.speculative_chunk() == 192
    assert loaded.speculative_chunk(1, 128) == 128
    older = CostModel.from_json(CostModel.fit(EPYC_FP32.items(), [(16, 1), (64, 2)]).to_json())
    assert older.step_tokens is None and older.speculative_chunk() is None


def _args(**kw) -> ServerArgs:
    values = dict(
        model_path="SmolLM2-135M-Instruct",
        dtype="float32",
        device="cpu",
        chunked_prefill_size=512,
        page_size=1,
    )
    return ServerArgs(**(values | kw))


def _save(directory, args: ServerArgs, step_tokens: int | None):
    model = CostModel.fit(
        EPYC_FP32.items(), [(16, 0.002), (4096, 0.02)], key_of_server_args(args), step_tokens
    )
    return ProfileStore(directory).save(model)


def test_a_measured_step_sets_the_chunk_when_none_was_given(tmp_path, monkeypatch):
    monkeypatch.setenv("S2L_PROFILE_DIR", str(tmp_path))
    args = _args()
    config = StreamConfig()
    assert with_measured_chunk(config, args) == config  # no profile with a step: the default
    path = _save(tmp_path, args, 1024)
    measured = with_measured_chunk(config, args)
    assert measured.speculative_chunk == 192
    assert measured.speculative_chunk_source == f"profile {path}"
    assert with_measured_chunk(measured, args) == measured


def test_a_given_chunk_an_unmeasured_profile_or_an_auto_dtype_keep_the_chunk(tmp_path, monkeypatch):
    monkeypatch.setenv("S2L_PROFILE_DIR", str(tmp_path))
    args = _args()
    _save(tmp_path, args, 1024)
    given = split_argv(["--stream-speculative-chunk", "384"])[0]
    assert given.speculative_chunk_source == "given"
    assert with_measured_chunk(given, args).speculative_chunk == 384
    assert with_measured_chunk(StreamConfig(), _args(dtype="auto")) == StreamConfig()
    _save(tmp_path, args, None)  # the same key, measured without the step: no chunk from it
    assert with_measured_chunk(StreamConfig(), args) == StreamConfig()


def test_serve_flags_leave_the_chunk_to_the_default_unless_given():
    config = split_argv([])[0]
    assert config.speculative_chunk_source == "default"
    assert config.speculative_chunk == StreamConfig().speculative_chunk
