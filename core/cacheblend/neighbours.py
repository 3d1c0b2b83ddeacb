"""Neighbour-aware warming: which passages a chunk's KV is computed behind.

A chunk warmed alone has KV that never attended to another passage; blended into a prompt beside
other passages, its deeper layers' KV is what the blend must repair, and a 15% recompute budget
repairs only part of it. Computed behind passages *like it* (``BlendConfig.neighbours``), the
cached KV already carries the cross-passage attention that retrieval usually brings: on the
development fact set this halved the blend's KL to full prefill, and passages that are similar
but never retrieved with it helped as much as the ones that are (docs/TUNING.md,
benchmarks/neighbour_eval.py). An unrelated primer of the same length does not help.

The engine picks neighbours itself with ``NeighbourIndex``: TF-IDF cosine over the chunks' token
ids, among every chunk the engine knows (this warm call's and every stored one). A caller with a
vector index can pass its own (``BlendEngine.warm(texts, behind=...)``, as
``CacheBlendFAISS`` does with its embeddings).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

_BLOCK = 256  # query rows scored at once: [block, pool] dense scores


class NeighbourIndex:
    """TF-IDF vectors of chunk token ids; ``nearest`` gives each query's most similar chunks.

    Token-id TF-IDF needs no embedding model and is deterministic; on RAG corpora the passages it
    calls similar share rare tokens (names, identifiers, topic words), which is what the measured
    gain needs. Scoring is a sparse x dense product in blocks, so memory stays
    O(pool + block x pool).
    """

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._ids: list[list[int]] = []
        self._row: dict[str, int] = {}
        self._matrix: torch.Tensor | None = None  # [pool, vocab] sparse, rows L2-normalised
        self._idf = torch.zeros(0)  # [vocab]

    def __len__(self) -> int:
        return len(self._texts)

    def __contains__(self, text: str) -> bool:
        return text in self._row

    def ids(self, text: str) -> list[int] | None:
        """The token ids ``text`` was added with (None if it was not)."""
        row = self._row.get(text)
        return None if row is None else self._ids[row]

    def add(self, texts: Sequence[str], ids: Sequence[Sequence[int]]) -> None:
        """Adds chunks (text and token ids); a text already present is kept once."""
        for text, tok in zip(texts, ids, strict=True):
            if text not in self._row and tok:
                self._row[text] = len(self._texts)
                self._texts.append(text)
                self._ids.append(list(tok))
                self._matrix = None

    def nearest(self, ids: Sequence[Sequence[int]], k: int, exclude: Sequence[str] = ()) -> list[list[str]]:
        """For each token-id list, the texts of its ``k`` most similar chunks, most similar first.

        ``exclude[i]`` (the query's own text) and chunks sharing no scored token are never returned.
        """
        if k < 1 or not self._texts or not ids:
            return [[] for _ in ids]
        matrix, idf = self._build()
        out: list[list[str]] = []
        for start in range(0, len(ids), _BLOCK):
            block = ids[start : start + _BLOCK]
            queries = _tfidf(block, idf).to_dense()  # [b, vocab]
            scores = torch.sparse.mm(matrix, queries.T).T  # [b, pool]
            top = scores.topk(min(len(self._texts), k + 1), dim=-1)
            for i, (vals, rows) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                own = exclude[start + i] if start + i < len(exclude) else None
                picks = [self._texts[r] for v, r in zip(vals, rows) if v > 0 and self._texts[r] != own]
                out.append(picks[:k])
        return out

    def _build(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._matrix is None:
            vocab = 1 + max(max(t) for t in self._ids)
            df = torch.zeros(vocab)
            for tok in self._ids:
                df[list(set(tok))] += 1
            self._idf = torch.where(df > 0, torch.log((1 + len(self._ids)) / (1 + df)) + 1.0, torch.zeros(()))
            self._matrix = _tfidf(self._ids, self._idf)
        return self._matrix, self._idf


def _tfidf(ids: Sequence[Sequence[int]], idf: torch.Tensor) -> torch.Tensor:
    """[len(ids), vocab] sparse TF-IDF rows, L2-normalised; tokens outside ``idf`` are dropped."""
    rows, cols, vals = [], [], []
    for r, tok in enumerate(ids):
        counts: dict[int, int] = {}
        for t in tok:
            if t < len(idf):
                counts[t] = counts.get(t, 0) + 1
        weights = {t: (1 + math.log(c)) * float(idf[t]) for t, c in counts.items()}
        norm = math.sqrt(sum(w * w for w in weights.values())) or 1.0
        for t, w in weights.items():
            rows.append(r)
            cols.append(t)
            vals.append(w / norm)
    index = torch.tensor([rows, cols], dtype=torch.long).reshape(2, -1)
    shape = (len(ids), len(idf))
    return torch.sparse_coo_tensor(index, torch.tensor(vals), shape, check_invariants=False).coalesce()


def behind(neighbour_ids: Sequence[Sequence[int]], fixed: int, room: int) -> list[Sequence[int]]:
    """The neighbours a chunk is computed behind, in the order they are placed after the chunk
    context: the most similar last (next to the chunk). ``neighbour_ids`` comes most similar
    first; the least similar are dropped until they and the ``fixed`` tokens (chunk context and
    chunk) fit in ``room``."""
    kept = list(neighbour_ids)
    while kept and fixed + sum(map(len, kept)) > room:
        kept.pop()
    return kept[::-1]
