"""Offline sentence-transformers embeddings for LangChain (default: the bundled all-MiniLM-L6-v2).

``langchain-huggingface`` is not a dependency and ``langchain_community``'s
``HuggingFaceEmbeddings`` is deprecated; this thin class puts LangChain's ``Embeddings`` interface
on ``cacheblend.integrations.SentenceEncoder`` (a local model folder, no model hub, normalised
vectors).
"""

from __future__ import annotations

from langchain_core.embeddings import Embeddings

from cacheblend.integrations import SentenceEncoder


class SentenceTransformerEmbeddings(Embeddings):
    """Embeds with a local ``sentence_transformers.SentenceTransformer``.

    model_path: folder of a sentence-transformers model; None: the bundled all-MiniLM-L6-v2.
    """

    def __init__(self, model_path: str | None = None, *, device: str = "cpu", normalize: bool = True) -> None:
        self._encoder = SentenceEncoder(model_path, device=device, normalize=normalize)
        self.model_path = self._encoder.model_path
        self.normalize = normalize

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._encoder.encode_lists(texts)

    def embed_query(self, text: str) -> list[float]:
        return self._encoder.encode_lists([text])[0]
