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
    from cacheblend.models import bundled

    return bundled.converted_dir()


@pytest.fixture(scope="session")
def real_engine():
    """The real bundled model, shared by every real-model test (fp32 KV for exactness)."""
    from cacheblend import shared_engine

    return shared_engine()


def _save_tiny_llama(path, tokenizer_dir, chat_template: bool) -> str:
    """A tiny random Llama with the bundled tokenizer, saved as a HF folder: "another model"."""
    from tiny_models import COMMON
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if not chat_template:
        tokenizer.chat_template = None
    torch.manual_seed(0)
    config = LlamaConfig(
        **dict(COMMON, vocab_size=len(tokenizer), num_hidden_layers=2, max_position_embeddings=8192),
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
    return _save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), bundled_dir, chat_template=True)


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory, bundled_dir):
    """A tiny random Llama whose tokenizer has no chat template (a base model)."""
    return _save_tiny_llama(tmp_path_factory.mktemp("tiny-base"), bundled_dir, chat_template=False)
