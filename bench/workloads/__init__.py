"""Workload generators: real retrieval systems that produce streaming traces (`bench.traces`).

- `ann`: progressive approximate-nearest-neighbour search over SQuAD (update mode).
- `crawler`: breadth-first crawl of the Python docs site on 127.0.0.1 (append mode).

Each runs as `python -m bench.workloads.<name> --out datasets/<name>/traces.jsonl[.xz]`, is
seeded, and writes stats.json (and CARD.md's statistics table) beside the traces. Downloads,
extracted data and embeddings are cached under `cache_dir()`, never in the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # data shipped in the repository: datasets/


def cache_dir(*parts: str) -> Path:
    """`$S2L_CACHE_DIR` or `~/.cache/stream2llm-sglang`, joined with `parts` and created."""
    base = os.environ.get("S2L_CACHE_DIR")
    if base:
        root = Path(base)
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stream2llm-sglang"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
