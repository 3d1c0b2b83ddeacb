"""The generation settings both framework LLM classes expose, as one pydantic mixin.

LangChain's chat model and LLM and LlamaIndex's LLM are pydantic models; each inherits these
fields (and adds its framework's name for the answer length: ``max_tokens`` in LangChain,
``max_new_tokens`` in LlamaIndex). Instances with the same model, device and dtype share one
engine through ``cacheblend.shared_engine``. Importing this module imports pydantic (a dependency
of both frameworks), never torch.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..models.bundled import ALIAS as BUNDLED_MODEL


class EngineFields(BaseModel):
    """Which model serves the calls, and how every call samples (overridable per call)."""

    model: str = Field(
        default=BUNDLED_MODEL,
        description="HF model id, local folder, .gguf file, or the bundled alias. Instances with the same "
        "model, device and dtype share one engine: one copy of the weights and one KV store.",
    )
    device: str = Field(default="auto", description="'cpu', 'cuda', 'cuda:N' or 'auto'.")
    dtype: str | None = Field(
        default=None, description="'float32', 'bfloat16' or 'float16'; None: fp32 on CPU, bf16 on CUDA."
    )
    recompute_ratio: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Fraction of reused chunk tokens recomputed (CacheBlend's r). None: the engine's "
        "measured default (~0.15). 1.0 is a full prefill (no cache read), 0.0 full reuse.",
    )
    temperature: float = Field(default=0.0, ge=0.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1.0 disables it.")
    top_k: int = Field(default=0, ge=0, description="Sample among the k likeliest tokens; 0 disables it.")
    seed: int | None = Field(default=None, description="Seed for sampling (temperature > 0); fixes the output.")
    stop: list[str] | None = Field(
        default=None,
        description="Stop strings (any length, any number of tokens); they never appear in the output. "
        "A call's own `stop` replaces these.",
    )
