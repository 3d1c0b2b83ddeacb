"""Tiny random models of every supported family, built from configs (no weights download)."""

import os

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM


COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    vocab_size=49152,
    tie_word_embeddings=False,
)


def tiny_model(family: str, rope: dict | None = None):
    """A tiny random model of ``family`` (fp32, eval), with optional rope parameters."""
    torch.manual_seed(1234)
    extra = {"rope_parameters": rope} if rope else {}
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**COMMON, **extra))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=48, **extra))
    elif family == "qwen2":
        cfg = Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=40, max_window_layers=2, **extra)
        model = Qwen2ForCausalLM(cfg)
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**COMMON, **extra))
    else:
        raise ValueError(family)
    # Random init gives near-uniform attention; sharper weights make the tests discriminating.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(4.0)
    # benchmarks/gpu_check.sh runs the equivalence tests on CUDA through this variable.
    return model.eval().to(os.environ.get("CACHEBLEND_TEST_DEVICE", "cpu"))


FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
