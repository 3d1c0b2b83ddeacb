"""ModelAdapter: the only module that touches transformers internals.

It exposes a decoder-only model as the pieces of its layer loop (embed, qkv before RoPE, RoPE
tables, attention, the rest of the layer, logits) so that ``blending/blend.py`` can run the loop
over a subset of rows. transformers 5.x renamed ``past_key_values`` to ``cache`` and moved RoPE settings to
``config.rope_parameters``; all of that is absorbed here.

Tensor conventions: hidden states [B, n, hidden]; q [B, heads, n, head_dim]; k, v
[B, kv_heads, n, head_dim]; positions are LongTensors of absolute token positions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .kernels import attend_split


class UnsupportedModelError(ValueError):
    """The model's architecture has no adapter."""


class ModelAdapter:
    """Layer-loop pieces of a Llama-family causal LM (``LlamaForCausalLM`` and look-alikes)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config
        self.body = model.model  # the decoder stack: embed_tokens, layers, norm, rotary_emb
        self.layers = self.body.layers
        attn = self.layers[0].self_attn
        self.num_layers = len(self.layers)
        self.head_dim = attn.head_dim
        self.num_heads = self.config.num_attention_heads
        self.num_kv_heads = self.config.num_key_value_heads
        self.scaling = attn.scaling
        self.max_positions = int(self.config.max_position_embeddings)
        self._windows = [_layer_window(self.config, i) for i in range(self.num_layers)]
        self.rope_kinds = [0] * self.num_layers  # layer -> rotary geometry (``rope``'s ``kind``)

    @property
    def device(self) -> torch.device:
        return self.body.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.body.embed_tokens.weight.dtype

    # -- the layer loop, piece by piece ------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, n] -> hidden [B, n, hidden]."""
        return self.body.embed_tokens(ids)

    def rope(self, positions: torch.Tensor, kind: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables [n, head_dim] at ``positions`` [n], from the model's own rotary embedding,
        for the rotary geometry ``kind`` (an entry of ``rope_kinds``; one geometry unless overridden)."""
        probe = torch.empty(0, device=self.device, dtype=self.dtype)
        cos, sin = self.body.rotary_emb(probe, positions[None], *self._rope_args(kind))
        return cos[0], sin[0]

    def _rope_args(self, kind: int) -> tuple:
        return ()

    def qkv(self, layer: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input norm + projections. h [B, n, hidden] -> q [B,H,n,d], k [B,Hkv,n,d], v [B,Hkv,n,d].

        Keys and queries are returned *before* RoPE (after q/k norm where the family has one).
        """
        x = self.attn_input(layer, h)
        return (self.q(layer, x), *self.kv(layer, x))

    def attn_input(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """The input norm: h [B, n, hidden] -> x [B, n, hidden], what ``q`` and ``kv`` project.
        Split from the projections so that a blend computes q only for the rows it keeps."""
        return self.layers[layer].input_layernorm(h)

    def q(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """x [B, n, hidden] (after ``attn_input``) -> q [B, H, n, d] before RoPE."""
        attn = self.layers[layer].self_attn
        return self._norm_q(attn, attn.q_proj(x).view(*x.shape[:-1], -1, self.head_dim)).transpose(1, 2)

    def kv(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, n, hidden] (after ``attn_input``) -> k, v [B, Hkv, n, d], k before RoPE."""
        attn = self.layers[layer].self_attn
        shape = (*x.shape[:-1], -1, self.head_dim)
        k = self._norm_k(attn, attn.k_proj(x).view(shape)).transpose(1, 2)
        return k, attn.v_proj(x).view(shape).transpose(1, 2)

    def _norm_q(self, attn: Any, q: torch.Tensor) -> torch.Tensor:
        return q

    def _norm_k(self, attn: Any, k: torch.Tensor) -> torch.Tensor:
        return k

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pos: torch.Tensor,
        key_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of a block of rows over their own keys, with an exact causal mask by position
        (and the layer's sliding window).

        q [B,H,n,d] (already rotated) and k, v [B,Hkv,n,d] at the same positions ``pos`` [n];
        key_valid [B, n] marks real (non-padding) keys. Returns [B, n, H*d]. (Rows over other
        keys: ``attend_block``, ``attend_step``.)
        """
        window = self._windows[layer]
        if key_valid is None and window is None and q.shape[2] == k.shape[2]:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling, enable_gqa=True)
        else:
            out = self._masked(q, k, v, pos, pos, window, key_valid)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (None for full attention)."""
        return self._windows[layer]

    def attend_block(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     visible: int | None = None) -> torch.Tensor:
        """One block of rows over one block of keys with an additive mask: q [1,H,n,d] (rotated),
        k, v [1,Hkv,m,d], mask [1,1,n,m]. With ``visible`` (``kernels.attend_split``, where
        ``kernels.prefix_split``): every row sees the first ``visible`` keys and ``mask``
        [1,1,(H/Hkv)*n,m-visible] covers the rest. Returns [1, n, H, d]."""
        if visible is not None:
            return attend_split(q, k, v, visible, mask, self.scaling)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=True)
        return out.transpose(1, 2)

    def _masked(self, q, k, v, q_pos, k_pos, window, key_valid) -> torch.Tensor:
        mask = k_pos[None, :] <= q_pos[:, None]  # [n, N]
        if window is not None:
            mask = mask & (k_pos[None, :] > q_pos[:, None] - window)
        mask = mask[None, None]  # [1, 1, n, N]
        if key_valid is not None:
            mask = mask & key_valid[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=True)

    def attend_step(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Attention of one new token per row, the rows at different positions (batched decoding).

        q [B,H,1,d] (rotated) of the tokens at ``positions`` [B]; k, v [B,Hkv,N,d] where row b's
        real keys are those at 0..positions[b] (the rest is padding). Returns [B, 1, H*d].
        """
        k_pos = torch.arange(k.shape[2], device=q.device)  # [N]
        mask = k_pos[None, :] <= positions[:, None]  # [B, N]
        window = self._windows[layer]
        if window is not None:
            mask = mask & (k_pos[None, :] > positions[:, None] - window)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask[:, None, None, :], scale=self.scaling, enable_gqa=True
        )  # [B, H, 1, d]
        return out.transpose(1, 2).reshape(q.shape[0], 1, -1)

    def linear_macs(self, layer: int | None) -> tuple[int, int]:
        """Multiply-accumulates one row costs in ``layer``'s linear weights: (the K and V
        projections, everything else: Q, O and the MLP); ``None``: (0, the LM head's)."""
        if layer is None:
            return 0, self.model.lm_head.weight.numel()
        block, attn = self.layers[layer], self.layers[layer].self_attn
        kv = attn.k_proj.weight.numel() + attn.v_proj.weight.numel()
        return kv, sum(m.weight.numel() for m in block.modules() if isinstance(m, torch.nn.Linear)) - kv

    def finish(self, layer: int, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """o_proj + residual, then the MLP block + residual. h [B,n,hidden] -> [B,n,hidden]."""
        block = self.layers[layer]
        h = h + block.self_attn.o_proj(attn_out)
        return h + block.mlp(block.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head. h [..., hidden] -> [..., vocab] in fp32."""
        return self.model.lm_head(self.body.norm(h)).float()

    # -- decoding with the HF model -----------------------------------------------------------
    def make_cache(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """A transformers cache over per-layer (rotated K [1,Hkv,N,d], V [1,Hkv,N,d]), without copying.

        ``DynamicCache(kv)`` would copy every layer (it concatenates onto an empty tensor) before
        the first token. The tensors are shared instead: a ``DynamicLayer`` only ever grows by
        ``torch.cat`` into new tensors, so decoding never writes into ``kv`` and the same KV can be
        decoded again (tests/core/test_decode.py checks that it stays bit-identical).
        """
        from transformers import DynamicCache

        cache = DynamicCache([(k[:, :, :0], v[:, :, :0]) for k, v in kv])  # empty, initialized layers
        for layer, (k, v) in zip(cache.layers, kv):
            layer.keys, layer.values = k, v
        return cache


class Qwen3Adapter(ModelAdapter):
    """Qwen3 adds an RMSNorm over head_dim to q and k before RoPE."""

    def _norm_q(self, attn: Any, q: torch.Tensor) -> torch.Tensor:
        return attn.q_norm(q)

    def _norm_k(self, attn: Any, k: torch.Tensor) -> torch.Tensor:
        return attn.k_norm(k)


class Gemma3Adapter(Qwen3Adapter):
    """Gemma 3 (text): Qwen3's q/k norms, plus

    - two rotary geometries: ``config.rope_parameters`` per layer type (base 10k on sliding layers,
      1M on full ones), so each layer rotates with its own type's tables (``rope_kinds``);
    - sandwich norms: the attention output and the MLP output are normed before their residual adds,
      and the MLP input has its own norm;
    - an optional final logit soft-cap. The scaled embedding (sqrt(hidden)) lives in the embedding
      module and the query scale (``query_pre_attn_scalar``) in ``attn.scaling``: nothing to add here.
    """

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self._layer_types = sorted(set(self.config.layer_types))  # the geometries, as the model orders them
        self.rope_kinds = [self._layer_types.index(t) for t in self.config.layer_types]

    def _rope_args(self, kind: int) -> tuple:
        return (self._layer_types[kind],)

    def finish(self, layer: int, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        block = self.layers[layer]
        h = h + block.post_attention_layernorm(block.self_attn.o_proj(attn_out))
        return h + block.post_feedforward_layernorm(block.mlp(block.pre_feedforward_layernorm(h)))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = super().logits(h)
        cap = getattr(self.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap


_FAMILIES = {  # config.model_type -> (adapter, what it covers)
    "llama": (ModelAdapter, "Llama 2/3 (incl. llama3 rope scaling), SmolLM2"),
    "mistral": (ModelAdapter, "Mistral"),
    "qwen2": (ModelAdapter, "Qwen2 / Qwen2.5"),
    "qwen3": (Qwen3Adapter, "Qwen3 (q/k norm)"),
    "gemma3_text": (Gemma3Adapter, "Gemma 3 text (q/k norm, sandwich norms, two RoPE bases, sliding window)"),
}
SUPPORTED = {name: about for name, (_, about) in _FAMILIES.items()}


def adapt(model: Any) -> ModelAdapter:
    """The adapter for ``model``; a clear error for an architecture without one."""
    model_type = getattr(model.config, "model_type", type(model).__name__)
    if model_type not in _FAMILIES:
        names = "; ".join(f"{k} ({v})" for k, v in SUPPORTED.items())
        raise UnsupportedModelError(f"model type {model_type!r} is not supported; cacheblend supports: {names}")
    rope = getattr(model.config, "rope_parameters", None) or {}
    per_type = [p for p in rope.values() if isinstance(p, dict)] or [rope]  # Gemma 3: one entry per layer type
    if any(p.get("rope_type", "default") == "dynamic" for p in per_type):
        raise UnsupportedModelError("dynamic NTK rope changes with the sequence length; cached keys cannot be reused")
    if getattr(model.config, "attn_logit_softcapping", None) is not None:
        raise UnsupportedModelError("attention logit soft-capping is not supported (the attention kernel has none)")
    if getattr(model.config, "use_bidirectional_attention", False):
        raise UnsupportedModelError("bidirectional attention is not a causal LM: chunk KV cannot be reused")
    return _FAMILIES[model_type][0](model)


def _layer_window(config: Any, layer: int) -> int | None:
    """The sliding window of ``layer`` (None for full attention), as transformers applies it."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return int(window) if layer_types[layer] == "sliding_attention" else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)
