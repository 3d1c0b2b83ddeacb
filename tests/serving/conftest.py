"""Fixtures: a tiny random engine and a real server over it on loopback."""

import pytest
from live_server import TINY, running

from cacheblend import BlendEngine


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    """A tiny random Llama (2 layers, 8192 positions) with the bundled tokenizer and chat template."""
    return BlendEngine.from_pretrained(tiny_model_dir, device="cpu")


@pytest.fixture(scope="module")
def tiny_url(tiny_engine):
    with running(tiny_engine, model_names=[TINY]) as url:
        yield url

