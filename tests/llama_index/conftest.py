"""Fixtures for the LlamaIndex integration: the real bundled model, real FAISS, real embeddings.

Everything heavy is session-scoped (the engine, the embedding model, one warmed and persisted
FAISS index). The engine's memory KV store is process-wide, so tests that need chunks the engine
has never seen build their own texts (see ``fresh_documents``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys
from pathlib import Path

import pytest
from llama_index.core import Settings, VectorStoreIndex

sys.path.insert(0, str(Path(__file__).parent))

from li_corpus import DOCUMENTS  # noqa: E402
from li_helpers import splitter  # noqa: E402

from llama_index_cacheblend import (  # noqa: E402
    CacheBlendLLM,
    KVCacheWarmer,
    SentenceTransformerEmbedding,
    faiss_storage_context,
    kv_store_dir,
    persist_index,
    record_blend_stats,
)


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(scope="session")
def llm() -> CacheBlendLLM:
    return CacheBlendLLM(max_new_tokens=24)


@pytest.fixture(scope="session")
def short_llm() -> CacheBlendLLM:
    """Same engine, 8-token answers: for tests about what is reused, not about answer length."""
    return CacheBlendLLM(max_new_tokens=8)


@pytest.fixture(scope="session")
def embed_model() -> SentenceTransformerEmbedding:
    return SentenceTransformerEmbedding()


@pytest.fixture(scope="session", autouse=True)
def offline_settings(llm, embed_model):
    """LlamaIndex falls back to OpenAI for anything not given; make every fallback local."""
    Settings.llm = llm
    Settings.embed_model = embed_model
    yield


@pytest.fixture
def stats():
    """Collects the BlendStats of every LLM call made during the test (instrumentation events)."""
    with record_blend_stats() as handler:
        yield handler


@pytest.fixture(scope="session")
def persisted(tmp_path_factory, llm, embed_model):
    """(index, persist_dir): the corpus in FAISS, KV warmed into <persist_dir>/cacheblend, persisted."""
    persist_dir = tmp_path_factory.mktemp("faiss_index")
    warmer = KVCacheWarmer(store_dir=str(kv_store_dir(persist_dir)))
    index = VectorStoreIndex.from_documents(
        DOCUMENTS,
        storage_context=faiss_storage_context(embed_model.dimension),
        transformations=[splitter(), warmer],
        embed_model=embed_model,
    )
    persist_index(index, persist_dir, llm.engine)
    return index, persist_dir
