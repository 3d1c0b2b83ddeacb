"""Fixtures for the engine tests: the bundled tokenizer and tiny random engines."""

import pytest
from tiny_models import tiny_model
from transformers import AutoTokenizer

from cacheblend import BlendConfig, BlendEngine


@pytest.fixture(scope="session")
def tokenizer(bundled_dir):
    return AutoTokenizer.from_pretrained(str(bundled_dir))


@pytest.fixture
def make_engine(tokenizer):
    def make(family: str = "llama", rope: dict | None = None, decode_batch: int = 16, **config) -> BlendEngine:
        config.setdefault("kv_dtype", "float32")
        config.setdefault("neighbours", 0)  # exactness tests need chunks warmed alone; test_neighbours sets it
        return BlendEngine(tiny_model(family, rope), tokenizer, config=BlendConfig(**config), decode_batch=decode_batch)

    return make


