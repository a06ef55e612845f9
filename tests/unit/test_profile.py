"""`s2l profile` pieces without an engine: token counts, swap timing on a real SGLang KV pool,
and where the scheduler finds a saved profile (the user's directory before the shipped ones)."""

from __future__ import annotations

import torch

from s2l_sglang.profile import measure_swap, token_counts
from s2l_sglang.sched.costmodel import (
    SHIPPED_DIR,
    CostModel,
    ProfileStore,
    find_cost_model,
    profile_key,
)


def test_token_counts_double_from_16_and_end_at_the_context_length():
    assert token_counts(100) == [16, 32, 64, 100]
    assert token_counts(128) == [16, 32, 64, 128]
    assert token_counts(8) == [8]


def test_swap_is_timed_on_a_real_pool_for_each_count():
    points = measure_swap(2, 1, 8, torch.float32, "cpu", [16, 64], repeats=2)
    assert [n for n, _ in points] == [16, 64]
    assert all(t > 0 for _, t in points)


def test_key_names_the_model_by_its_folder():
    key = profile_key("/root/.cache/x/SmolLM2-135M-Instruct/", "cpu", "float32", 1, 1)
    assert key.model == "SmolLM2-135M-Instruct" and key.tp_size == 1


def test_user_profile_wins_over_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.setenv("S2L_PROFILE_DIR", str(tmp_path))
    key = profile_key("m", "cpu", "float32", 1, 1)
    assert find_cost_model(key) is None or find_cost_model(key)[1].parent == SHIPPED_DIR
    model = CostModel.fit([(16, 0.1), (64, 0.4)], [(16, 0.2), (64, 0.3)], key)
    path = ProfileStore(tmp_path).save(model)
    found, where = find_cost_model(key)
    assert where == path and found.choose(16) == "recompute" and found.choose(64) == "swap"


def test_the_embedded_model_on_cpu_has_a_shipped_profile():
    key = profile_key("SmolLM2-135M-Instruct", "cpu", "float32", 1, 1)
    shipped = ProfileStore(SHIPPED_DIR).find(key)
    assert shipped is not None and shipped.key == key
    assert shipped.recompute(4096) > shipped.recompute(16) > 0
