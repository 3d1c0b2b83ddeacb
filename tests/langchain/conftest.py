"""Fixtures for the LangChain integration tests: the real bundled model, real MiniLM embeddings,
real FAISS, and a real corpus (passages of Python's own reference documentation).

The bundled model's engine is process-wide (``cacheblend.shared_engine``), so its memory KV store
is shared by every test here. Tests that must see a chunk *not* warmed yet use texts no other test
uses (``fresh_texts``).
"""

import pytest
from lc_helpers import pydoc_documents


@pytest.fixture(scope="session")
def engine(real_engine):
    """The bundled model's shared engine (the one ChatCacheBlend() and CacheBlendFAISS use)."""
    return real_engine


@pytest.fixture(scope="session")
def embeddings():
    from langchain_cacheblend import SentenceTransformerEmbeddings

    return SentenceTransformerEmbeddings()


@pytest.fixture(scope="session")
def corpus():
    return pydoc_documents()


@pytest.fixture(scope="session")
def rag_store(corpus, embeddings, engine):
    """A CacheBlendFAISS index over the corpus (its KV warmed in the shared engine)."""
    from langchain_cacheblend import CacheBlendFAISS

    return CacheBlendFAISS.from_documents(corpus, embeddings)
