"""Cost model: interpolation, extrapolation, per-victim choice, JSON, profile lookup, modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from s2l_sglang.sched.costmodel import (
    CostModel,
    PiecewiseLinear,
    ProfileKey,
    ProfileStore,
    find_profile,
)
from s2l_sglang.sched.preemption import get_preemption, preemption_names, register_preemption

KEY = ProfileKey(model="HuggingFaceTB/SmolLM2-135M-Instruct", device="cpu", dtype="float32")
# recompute grows faster than swap: recompute is cheaper for short caches, swap for long ones;
# the curves cross at 2048 tokens (both 0.02 s)
RECOMPUTE = [(16, 0.001), (1024, 0.01), (2048, 0.02), (4096, 0.05)]
SWAP = [(16, 0.004), (1024, 0.015), (2048, 0.02), (4096, 0.03)]


def model(key: ProfileKey | None = KEY) -> CostModel:
    return CostModel(PiecewiseLinear(RECOMPUTE), PiecewiseLinear(SWAP), key)


def test_interpolates_between_points() -> None:
    f = PiecewiseLinear(RECOMPUTE)
    assert f(16) == pytest.approx(0.001)
    assert f(1024) == pytest.approx(0.01)
    assert f(1536) == pytest.approx(0.015)  # midway between 1024 and 2048
    assert f(3072) == pytest.approx(0.035)


def test_extrapolates_linearly_past_both_ends_never_below_zero() -> None:
    f = PiecewiseLinear(RECOMPUTE)
    slope_hi = (0.05 - 0.02) / (4096 - 2048)
    assert f(131_072) == pytest.approx(0.05 + slope_hi * (131_072 - 4096))
    slope_lo = (0.01 - 0.001) / (1024 - 16)
    assert f(8) == pytest.approx(0.001 - slope_lo * 8)
    assert f(0) >= 0.0
    assert PiecewiseLinear([(100, 0.0), (200, 1.0)])(0) == 0.0  # clamped


def test_points_validation() -> None:
    with pytest.raises(ValueError, match="two points"):
        PiecewiseLinear([(16, 0.1)])
    with pytest.raises(ValueError, match="duplicate"):
        PiecewiseLinear([(16, 0.1), (16, 0.2)])


def test_fit_takes_the_median_of_repeated_samples() -> None:
    samples = [(16, 0.001), (16, 0.009), (16, 0.002), (64, 0.004), (64, 0.1), (64, 0.005)]
    f = PiecewiseLinear.fit(samples)
    assert f.points() == [[16.0, 0.002], [64.0, 0.005]]
    cm = CostModel.fit(recompute=samples, swap=[(16, 1.0), (64, 2.0)], key=KEY)
    assert cm.recompute(16) == pytest.approx(0.002) and cm.swap(64) == pytest.approx(2.0)


def test_choose_flips_at_the_crossover() -> None:
    cm = model()
    assert cm.choose(16) == "recompute"
    assert cm.choose(2047) == "recompute"
    assert cm.choose(2048) == "recompute"  # a tie recomputes (no host memory needed)
    assert cm.choose(2049) == "swap"
    assert cm.choose(131_072) == "swap"


def test_auto_mode_decides_on_each_victims_own_cached_tokens() -> None:
    auto = get_preemption("auto", model())
    # one step, one big scheduled request, two victims: each victim gets its own answer
    assert [auto.decide(c) for c in (100, 30_000)] == ["recompute", "swap"]
    assert auto.decide(30_000, host_free_kv=10_000) == "recompute"  # host cannot hold it


def test_preemption_modes_registry() -> None:
    assert preemption_names()[:3] == ["recompute", "swap", "auto"]
    assert get_preemption("recompute").decide(10**6) == "recompute"
    assert get_preemption("swap").decide(10) == "swap"
    assert get_preemption("swap").decide(10, host_free_kv=5) == "recompute"
    with pytest.raises(ValueError, match="cost model"):
        get_preemption("auto")
    with pytest.raises(ValueError, match="unknown preemption mode"):
        get_preemption("lru")
    with pytest.raises(ValueError, match="already registered"):
        register_preemption("swap")(type(get_preemption("swap")))


def test_json_round_trip() -> None:
    cm = model()
    back = CostModel.from_json(cm.to_json())
    assert back.key == KEY
    assert back.recompute.points() == cm.recompute.points()
    assert back.swap.points() == cm.swap.points()
    assert json.loads(cm.to_json())["key"]["dtype"] == "float32"
    with pytest.raises(ValueError, match="format"):
        CostModel.from_json(json.dumps({"format": 99}))


def test_profile_store_finds_the_matching_key(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "profiles")
    assert store.find(KEY) is None  # no directory yet
    path = store.save(model())
    other = ProfileKey(KEY.model, "cuda:H200", "bfloat16", tp_size=2, page_size=16)
    store.save(CostModel(PiecewiseLinear(SWAP), PiecewiseLinear(RECOMPUTE), other))
    (tmp_path / "profiles" / "notes.json").write_text("[1, 2]")  # not a profile: skipped
    (tmp_path / "profiles" / "broken.json").write_text("{")
    assert path.name.startswith("SmolLM2-135M-Instruct__cpu__float32__tp1__page1__")
    found = find_profile(tmp_path / "profiles", KEY)
    assert found is not None and found.choose(16) == "recompute"
    found_other = store.find(other)
    assert found_other is not None and found_other.choose(16) == "swap"
    assert store.find(ProfileKey(KEY.model, "cpu", "bfloat16")) is None
    # a profile under any file name is found by the key it holds
    path.rename(path.with_name("renamed.json"))
    assert store.find(KEY) is not None
    with pytest.raises(ValueError, match="key"):
        store.save(model(key=None))


def test_profile_file_names_differ_per_key() -> None:
    a = ProfileKey("org-a/Model", "cpu", "float32")
    b = ProfileKey("org-b/Model", "cpu", "float32")
    assert a.filename() != b.filename()
    assert a.filename() == ProfileKey("org-a/Model", "cpu", "float32").filename()
