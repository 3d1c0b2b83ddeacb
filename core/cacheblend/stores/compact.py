"""Compact chunk KV: int8 with keys quantized per channel and values per token.

Why these axes: keys (stored *before* RoPE) have a few outlier channels that are large for every
token (KVQuant), so one scale per (layer, head, channel) keeps the other channels precise; values
have no such channels, and one scale per (layer, head, token) bounds each token's error (KIVI).
Scales are fp16 (symmetric, absmax / 127), so int8 records take about 0.51x the bytes of fp16.

A codec only changes the bytes a persistent tier holds. Warming passes every int8 chunk through
``roundtrip`` before it enters any tier, so a chunk read back from disk or Redis is bitwise the one
held in memory, and the quality cost is paid once, the same on every tier.
"""

from __future__ import annotations

import torch

CODECS = ("plain", "int8")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_TINY = 2.0**-24  # smallest fp16 subnormal: a scale never rounds to 0


def codec_for(kv_dtype: str) -> str:
    """The codec persistent tiers use for a ``BlendConfig.kv_dtype``."""
    return "int8" if kv_dtype == "int8" else "plain"


def dense_dtype(kv_dtype: str) -> torch.dtype:
    """The dtype chunk KV has in memory for a ``BlendConfig.kv_dtype`` (int8 is held as fp16)."""
    return torch.float16 if kv_dtype == "int8" else _DTYPES[kv_dtype]


def pack(kv: torch.Tensor, codec: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and header fields of ``kv`` ([layers, 2, kv_heads, T, head_dim]) under ``codec``."""
    kv = kv.detach().contiguous().cpu()
    if codec == "plain":
        return {"kv": kv}, {"codec": "plain"}
    if codec != "int8":
        raise ValueError(f"codec must be one of {', '.join(CODECS)}; got {codec!r}")
    q, k_scale, v_scale = quantize_int8(kv)
    dtype = str(kv.dtype).removeprefix("torch.")
    return {"kv": q, "k_scale": k_scale, "v_scale": v_scale}, {"codec": "int8", "dtype": dtype}


def unpack(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> torch.Tensor:
    """The dense KV of a record's tensors; ValueError for an unknown codec or missing tensor."""
    codec = meta.get("codec")
    if codec == "plain":
        return tensors["kv"]
    if codec == "int8" and meta.get("dtype") in _DTYPES:
        return dequantize_int8(tensors["kv"], tensors["k_scale"], tensors["v_scale"], _DTYPES[meta["dtype"]])
    raise ValueError(f"unknown codec {codec!r} / dtype {meta.get('dtype')!r}")


def quantize_int8(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv [L, 2, H, T, D] -> (q int8 [L, 2, H, T, D], k_scale fp16 [L, H, 1, D], v_scale fp16 [L, H, T, 1])."""
    k, v = kv[:, 0].float(), kv[:, 1].float()  # [L, H, T, D] each
    k_scale = (k.abs().amax(dim=2, keepdim=True) / 127).clamp_min(_TINY).half()  # per channel [L, H, 1, D]
    v_scale = (v.abs().amax(dim=3, keepdim=True) / 127).clamp_min(_TINY).half()  # per token [L, H, T, 1]
    qk = (k / k_scale.float()).round().clamp(-127, 127)  # the rounded scale is the one stored
    qv = (v / v_scale.float()).round().clamp(-127, 127)
    return torch.stack([qk, qv], dim=1).to(torch.int8), k_scale, v_scale


def dequantize_int8(q: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``quantize_int8`` up to rounding: [L, 2, H, T, D] in ``dtype``."""
    if dtype == torch.float16:  # q * s is exact in fp32 and rounded once either way: same bits, half the time
        out = torch.empty(q.shape, dtype=dtype)  # [L, 2, H, T, D]
        torch.mul(q[:, 0], k_scale, out=out[:, 0])
        torch.mul(q[:, 1], v_scale, out=out[:, 1])
        return out
    k = q[:, 0].float() * k_scale.float()  # [L, H, T, D]
    v = q[:, 1].float() * v_scale.float()
    return torch.stack([k, v], dim=1).to(dtype)


def roundtrip(kv: torch.Tensor, codec: str) -> torch.Tensor:
    """What a tier returns for ``kv`` stored under ``codec``: the tensor every tier must hold."""
    if codec == "plain":
        return kv
    return unpack(*pack(kv, codec))
