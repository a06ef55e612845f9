"""Preemption cost model: measured latency of recompute and of swap, per token count; the
recompute points that took one prefill step also give `speculative_chunk` (`chunk_for_step`).

Each curve is piecewise linear through measured (tokens, seconds) points, extended linearly past
both ends with the end segments' slopes (never below 0). Profiles are saved as JSON under a key
(model, device, dtype, tp_size, page_size), since the numbers hold only for that setup; a
`ProfileStore` finds the one for the running setup in a directory, or None.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

Choice = Literal["recompute", "swap"]
_FORMAT = 1


class PiecewiseLinear:
    """y(x) through >= 2 points with distinct x, linear extrapolation outside them."""

    __slots__ = ("xs", "ys")

    def __init__(self, points: Iterable[tuple[float, float]]) -> None:
        pts = sorted((float(x), float(y)) for x, y in points)
        if len(pts) < 2:
            raise ValueError("need at least two points")
        xs = [x for x, _ in pts]
        if any(a == b for a, b in pairwise(xs)):
            raise ValueError("duplicate x; use PiecewiseLinear.fit for repeated samples")
        self.xs = xs
        self.ys = [y for _, y in pts]

    @classmethod
    def fit(cls, samples: Iterable[tuple[float, float]]) -> PiecewiseLinear:
        """From raw (tokens, seconds) timing samples: the median of the repeats of each x."""
        by_x: dict[float, list[float]] = {}
        for x, y in samples:
            by_x.setdefault(float(x), []).append(float(y))
        return cls((x, statistics.median(ys)) for x, ys in by_x.items())

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        i = bisect_right(xs, x)
        i = min(max(i, 1), len(xs) - 1)  # segment [i-1, i]; the end segments extrapolate
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))

    def points(self) -> list[list[float]]:
        return [[x, y] for x, y in zip(self.xs, self.ys, strict=True)]


@dataclass(frozen=True, slots=True)
class ProfileKey:
    """The setup a profile was measured on; a profile is used only on an equal key."""

    model: str
    device: str
    dtype: str
    tp_size: int = 1
    page_size: int = 1

    def filename(self) -> str:
        """A readable file name unique to the key (a hash of the whole key ends it), e.g.
        `SmolLM2-135M__cpu__float32__tp1__page1__3f9a1c2b.json`."""
        parts = [self.model.rstrip("/").rsplit("/", 1)[-1], self.device, self.dtype]
        slug = "__".join(re.sub(r"[^A-Za-z0-9._-]+", "-", p) for p in parts)
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        return f"{slug}__tp{self.tp_size}__page{self.page_size}__{digest[:8]}.json"


#: `speculative_chunk` from a profile is a multiple of this many tokens (and of the page size)
CHUNK_UNIT = 64


def chunk_for_step(
    points: Iterable[tuple[float, float]], page_size: int = 1, step_tokens: int | None = None
) -> int | None:
    """`speculative_chunk` from measured (tokens, seconds) of prefill-only requests that each
    took one prefill step: the size whose prefill takes twice the smallest one's (interpolated
    between the points; the largest point if none takes that long), rounded up to a multiple of
    `CHUNK_UNIT` and of the page size, at most `step_tokens` (rounded down; None or <= 0: no
    limit). The smallest request is about a step's fixed part, so a final context then waits
    behind about two empty steps' time of speculative work at most, and a speculative step
    spends about half its time or less on the fixed part: a smaller chunk would shorten the
    wait by less than it adds fixed cost to speculative work, a larger one the other way round.
    Read off the points, not a fitted line: on a CPU a step's cost grows faster than linearly
    with its tokens (attention), which pulls a line's fixed part down. None with fewer than two
    points."""
    pts = sorted((float(n), float(t)) for n, t in points)
    if len(pts) < 2 or pts[0][1] <= 0:
        return None
    target = 2 * pts[0][1]
    size = pts[-1][0]
    for (a, ta), (b, tb) in pairwise(pts):
        if tb >= target:
            size = a + (b - a) * (target - ta) / (tb - ta) if tb > ta else a
            break
    unit = math.lcm(CHUNK_UNIT, max(1, int(page_size)))
    chunk = max(unit, math.ceil(size / unit) * unit)
    if step_tokens is not None and step_tokens > 0:
        chunk = min(chunk, max(unit, step_tokens // unit * unit))
    return chunk


class CostModel:
    """Latency of preempting a victim that holds `held_tokens` of KV, two ways:
    `recompute(n)`: prefill n tokens again later (the KV is just freed now);
    `swap(n)`: copy n tokens of KV to host and back (swap-out + swap-in).
    `choose(n)` picks the cheaper for THAT victim's own held tokens (ties: recompute, which
    needs no host memory). `step_tokens`: the prefill step (`chunked_prefill_size`) of the
    engine that measured the profile, so its recompute points up to that size each took one
    step (`speculative_chunk`); None in profiles from before 2026-12-07, which did not record
    it (and some of which were measured on a loaded machine)."""

    __slots__ = ("key", "recompute", "step_tokens", "swap")

    def __init__(
        self,
        recompute: PiecewiseLinear,
        swap: PiecewiseLinear,
        key: ProfileKey | None = None,
        step_tokens: int | None = None,
    ) -> None:
        self.recompute = recompute
        self.swap = swap
        self.key = key
        self.step_tokens = step_tokens

    @classmethod
    def fit(
        cls,
        recompute: Iterable[tuple[float, float]],
        swap: Iterable[tuple[float, float]],
        key: ProfileKey | None = None,
        step_tokens: int | None = None,
    ) -> CostModel:
        """From raw (tokens, seconds) samples of each operation, repeats allowed."""
        return cls(PiecewiseLinear.fit(recompute), PiecewiseLinear.fit(swap), key, step_tokens)

    def choose(self, held_tokens: int) -> Choice:
        return "recompute" if self.recompute(held_tokens) <= self.swap(held_tokens) else "swap"

    def speculative_chunk(
        self, page_size: int | None = None, step_tokens: int | None = None
    ) -> int | None:
        """`chunk_for_step` on the recompute points that took one step, for an engine with
        that page size and step (None: the profile's own, its key's page size and the step it
        was measured with); None if the profile did not record its step."""
        if self.step_tokens is None:
            return None
        if page_size is None:
            page_size = self.key.page_size if self.key is not None else 1
        points = [(x, y) for x, y in zip(self.recompute.xs, self.recompute.ys, strict=True)]
        one_step = [(x, y) for x, y in points if x <= self.step_tokens]
        return chunk_for_step(one_step, page_size, step_tokens or self.step_tokens)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "key": None if self.key is None else asdict(self.key),
                "recompute": self.recompute.points(),
                "swap": self.swap.points(),
                **({} if self.step_tokens is None else {"step_tokens": self.step_tokens}),
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise ValueError(f"not a cost-model profile of format {_FORMAT}")
        key = None if d.get("key") is None else ProfileKey(**d["key"])
        rc = PiecewiseLinear(map(tuple, d["recompute"]))
        sw = PiecewiseLinear(map(tuple, d["swap"]))
        step = d.get("step_tokens")
        return cls(rc, sw, key, None if step is None else int(step))


class ProfileStore:
    """Saved cost-model profiles, one JSON file per key, in one directory."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def save(self, model: CostModel) -> Path:
        if model.key is None:
            raise ValueError("a profile needs a key to be saved")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / model.key.filename()
        path.write_text(model.to_json())
        return path

    def find(self, key: ProfileKey) -> CostModel | None:
        """The profile whose key equals `key` (any file name), or None."""
        if not self.directory.is_dir():
            return None
        preferred = self.directory / key.filename()
        paths = sorted(self.directory.glob("*.json"))
        if preferred in paths:  # the usual name first, then any other file
            paths.remove(preferred)
            paths.insert(0, preferred)
        for path in paths:
            try:
                model = CostModel.from_json(path.read_text())
            except (OSError, ValueError, KeyError, TypeError):  # not a profile: skip it
                continue
            if model.key == key:
                return model
        return None


def find_profile(directory: str | Path, key: ProfileKey) -> CostModel | None:
    """Shorthand for `ProfileStore(directory).find(key)`."""
    return ProfileStore(directory).find(key)


# ---- where profiles are kept --------------------------------------------------------------

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "profiles"  # s2l_sglang/profiles


def user_profile_dir() -> Path:
    """`$S2L_PROFILE_DIR`, else `~/.cache/stream2llm-sglang/profiles`."""
    env = os.environ.get("S2L_PROFILE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stream2llm-sglang" / "profiles"


def profile_key(
    model_path: str, device: str, dtype: str, tp_size: int, page_size: int
) -> ProfileKey:
    """The key of a setup: the model by its folder or hub name (not the cache path)."""
    model = str(model_path).rstrip("/").rsplit("/", 1)[-1]
    return ProfileKey(model, str(device), str(dtype), int(tp_size or 1), int(page_size or 1))


def key_of_server_args(server_args: Any, dtype: str | None = None) -> ProfileKey:
    """The profile key of an SGLang `ServerArgs` (`dtype`: the resolved model dtype)."""
    return profile_key(
        server_args.model_path,
        server_args.device or "cpu",
        dtype or server_args.dtype,
        server_args.tp_size,
        server_args.page_size,
    )


def find_cost_model(key: ProfileKey) -> tuple[CostModel, Path] | None:
    """The saved profile for `key`: the user's directory first, then the shipped ones."""
    for directory in (user_profile_dir(), SHIPPED_DIR):
        model = ProfileStore(directory).find(key)
        if model is not None:
            return model, directory / key.filename()
    return None
