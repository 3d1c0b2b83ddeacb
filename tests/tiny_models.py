"""Tiny random models of every supported family, built from configs (no weights download)."""

import os

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers import Gemma3ForCausalLM, Gemma3TextConfig
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


# Gemma 3 as its real configs have it, shrunk: 5 of every 6 layers slide (a window the test prompts
# cross), two rotary geometries (a linear-scaled one on the full layers, as Gemma 3 4B+ has), a query
# scale that is not 1/sqrt(head_dim), a final logit soft-cap, tied embeddings.
GEMMA3 = dict(
    COMMON,
    num_hidden_layers=6,
    num_key_value_heads=1,
    sliding_window=32,
    query_pre_attn_scalar=24,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    },
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
    elif family == "gemma3":
        model = Gemma3ForCausalLM(Gemma3TextConfig(**GEMMA3, **({"rope_parameters": rope} if rope else {})))
    else:
        raise ValueError(family)
    # Random init gives near-uniform attention; sharper weights make the tests discriminating.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(4.0)
            if name.endswith(("q_norm.weight", "k_norm.weight")) and family == "gemma3":
                p.fill_(3.0)  # Gemma's RMSNorm scales by (1 + w): x4, as above (its q/k norms undo a q_proj scale)
    # benchmarks/gpu_check.sh runs the equivalence tests on CUDA through this variable.
    return model.eval().to(os.environ.get("CACHEBLEND_TEST_DEVICE", "cpu"))


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3"]
