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


def _save_tiny_model(path, bundled_dir, chat_template: bool) -> str:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_dir))
    if not chat_template:
        tokenizer.chat_template = None
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, bundled_dir):
    """Another real model (a tiny random Llama with the bundled tokenizer and chat template), saved
    as a folder: its KV must never be confused with the bundled model's."""
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), bundled_dir, chat_template=True)


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory, bundled_dir):
    """A tiny random Llama whose tokenizer has no chat template (a base model)."""
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-base"), bundled_dir, chat_template=False)
