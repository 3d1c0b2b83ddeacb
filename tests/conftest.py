"""Shared test setup: offline, deterministic, one real bundled model per session."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.manual_seed(0)


@pytest.fixture(scope="session")
def bundled_dir():
    """The bundled SmolLM2 model as safetensors (converted from GGUF on the first run)."""
    from cacheblend import bundled

    return bundled.converted_dir()


@pytest.fixture(scope="session")
def real_engine():
    """The real bundled model, shared by every real-model test (fp32 KV for exactness)."""
    from cacheblend import shared_engine

    return shared_engine()
