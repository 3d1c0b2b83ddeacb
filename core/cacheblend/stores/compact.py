"""Compact chunk KV: int8 (and int4) with keys quantized per channel and values per token.

Why these axes: keys (stored *before* RoPE) have a few outlier channels that are large for every
token (KVQuant), so one scale per (layer, head, channel) keeps the other channels precise; values
have no such channels, and one scale per (layer, head, token) bounds each token's error (KIVI).
Scales are fp16 (symmetric, absmax / 127), so int8 records take about 0.51x the bytes of fp16.
int4 (KIVI's grouping): asymmetric 16 levels, keys per channel in groups of 32 tokens, values per
token in groups of 32 channels, fp16 scale and minimum per group, two codes per byte: ~0.31x.

A codec only changes the bytes a persistent tier holds. Warming passes every int8 chunk through
``roundtrip`` before it enters any tier, so a chunk read back from disk or Redis is bitwise the one
held in memory, and the quality cost is paid once, the same on every tier.
"""

from __future__ import annotations

import torch

CODECS = ("plain", "int8", "int4")
GROUP = 32  # int4 group size (tokens for keys, channels for values)
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_TINY = 2.0**-24  # smallest fp16 subnormal: a scale never rounds to 0


def codec_for(kv_dtype: str) -> str:
    """The codec persistent tiers use for a ``BlendConfig.kv_dtype``."""
    return kv_dtype if kv_dtype in ("int8", "int4") else "plain"


def dense_dtype(kv_dtype: str) -> torch.dtype:
    """The dtype chunk KV has in memory for a ``BlendConfig.kv_dtype`` (int8/int4 are held as fp16)."""
    return torch.float16 if kv_dtype in ("int8", "int4") else _DTYPES[kv_dtype]


def pack(kv: torch.Tensor, codec: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and header fields of ``kv`` ([layers, 2, kv_heads, T, head_dim]) under ``codec``."""
    kv = kv.detach().contiguous().cpu()
    if codec == "plain":
        return {"kv": kv}, {"codec": "plain"}
    dtype = str(kv.dtype).removeprefix("torch.")
    if codec == "int4":
        return quantize_int4(kv), {"codec": "int4", "dtype": dtype}
    if codec != "int8":
        raise ValueError(f"codec must be one of {', '.join(CODECS)}; got {codec!r}")
    q, k_scale, v_scale = quantize_int8(kv)
    return {"kv": q, "k_scale": k_scale, "v_scale": v_scale}, {"codec": "int8", "dtype": dtype}


def unpack(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> torch.Tensor:
    """The dense KV of a record's tensors; ValueError for an unknown codec or missing tensor."""
    codec = meta.get("codec")
    if codec == "plain":
        return tensors["kv"]
    if codec == "int8" and meta.get("dtype") in _DTYPES:
        return dequantize_int8(tensors["kv"], tensors["k_scale"], tensors["v_scale"], _DTYPES[meta["dtype"]])
    if codec == "int4" and meta.get("dtype") in _DTYPES:
        return dequantize_int4(tensors, _DTYPES[meta["dtype"]])
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


def quantize_int4(kv: torch.Tensor) -> dict[str, torch.Tensor]:
    """kv [L, 2, H, T, D] -> codes uint8 [L, 2, H, T, D/2] (two per byte) and per-group fp16 scale
    and minimum: keys [L, H, ceil(T/G), 1, D] (channel, G tokens), values [L, H, T, D/g, 1]."""
    k, v = kv[:, 0].float(), kv[:, 1].float()  # [L, H, T, D]
    L, H, T, D = k.shape
    pad = -T % GROUP
    kp = torch.cat([k, k[:, :, -1:].expand(L, H, pad, D)], dim=2) if pad else k  # [L, H, Tp, D] edge-padded
    kg = kp.reshape(L, H, -1, GROUP, D)  # [L, H, Tg, G, D]
    qk, k_scale, k_min = _asym4(kg, dim=3)
    g = min(GROUP, D)
    qv, v_scale, v_min = _asym4(v.reshape(L, H, T, D // g, g), dim=4)  # [L, H, T, D/g, g]
    codes = torch.stack([qk.reshape(L, H, -1, D)[:, :, :T], qv.reshape(L, H, T, D)], dim=1)  # [L, 2, H, T, D]
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()  # [L, 2, H, T, D/2]
    return {"kv": packed, "k_scale": k_scale, "k_min": k_min, "v_scale": v_scale, "v_min": v_min}


def dequantize_int4(t: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``quantize_int4`` up to rounding: [L, 2, H, T, D] in ``dtype``."""
    packed = t["kv"]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).float()  # [L, 2, H, T, D]
    L, _, H, T, D = codes.shape
    k_scale = t["k_scale"].float().repeat_interleave(GROUP, dim=2)[:, :, :T, 0]  # [L, H, T, D]
    k_min = t["k_min"].float().repeat_interleave(GROUP, dim=2)[:, :, :T, 0]
    k = codes[:, 0] * k_scale + k_min
    g = min(GROUP, D)
    v = codes[:, 1].reshape(L, H, T, D // g, g) * t["v_scale"].float() + t["v_min"].float()  # [L, H, T, D/g, g]
    return torch.stack([k, v.reshape(L, H, T, D)], dim=1).to(dtype)


def _asym4(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes 0..15 (uint8) of ``x`` with one fp16 scale and minimum per slice along ``dim``."""
    lo = x.amin(dim=dim, keepdim=True).half()
    scale = ((x.amax(dim=dim, keepdim=True) - lo.float()) / 15).clamp_min(_TINY).half()
    codes = ((x - lo.float()) / scale.float()).round().clamp(0, 15).to(torch.uint8)
    return codes, scale, lo


def roundtrip(kv: torch.Tensor, codec: str) -> torch.Tensor:
    """What a tier returns for ``kv`` stored under ``codec``: the tensor every tier must hold.

    A fixed point of pack/unpack, so a tier that stores what another returned holds the same
    bits: one int4 pass is not always one (a group's decoded maximum rounds to the dense dtype,
    and the scale re-derived from it can move by an ulp; ``tests/core/test_properties.py`` pins
    such a record), so passes repeat until the bits stop changing, at most four."""
    if codec == "plain":
        return kv
    held = unpack(*pack(kv, codec))
    for _ in range(3):
        again = unpack(*pack(held, codec))
        if torch.equal(again, held):
            break
        held = again
    return held
