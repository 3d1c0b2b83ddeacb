"""Attention of a block of rows whose leading keys every row sees: the blend's CPU kernel.

After a check layer a blend computes a sparse set of rows, grouped into contiguous runs
(``blending/rows.py``). A group of rows at positions p0 < ... < p1 sees every key before p0 and,
past it, each row only the keys up to its own position. One masked SDPA call over keys [0, p1] is
what ran before: a masked call applies its mask to every block, the visible prefix included, and
a small group of rows makes small blocks. Here the group runs as two calls of the
CPU flash kernel, one over the visible prefix without a mask and one over the rest with the
causal mask, merged exactly by their log-sum-exps. The query heads that share a K/V head are
stacked as rows of one call (``enable_gqa`` repeats the keys instead), so each call has
``heads // kv_heads`` times more rows: bigger blocks. ``benchmarks/attention_split.py`` measures
the two end to end (README: 1.03x on SmolLM2's MuSiQue prompts, within noise on Qwen2.5's).

The flash kernel that returns the log-sum-exp is a private ATen op
(``_scaled_dot_product_flash_attention_for_cpu``, torch's own CPU SDPA path); where it is missing,
or on another device, ``prefix_split`` is False and the blend keeps the one masked call.
"""

from __future__ import annotations

import torch

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def prefix_split(device: torch.device) -> bool:
    """Whether ``attend_split`` runs on ``device`` (CPU, with the flash op present)."""
    return device.type == "cpu" and _FLASH_CPU is not None


def stack_heads(mask: torch.Tensor, group: int) -> torch.Tensor:
    """A mask [1, 1, n, m] for the ``group`` query heads of one K/V head stacked as rows: [1, 1, group*n, m]."""
    return mask.repeat(1, 1, group, 1)


def attend_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: int, mask: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """Rows q [1,H,n,d] (rotated) over keys k, v [1,Hkv,m,d]: every row sees keys [0, visible),
    and keys [visible, m) where ``mask`` (additive, [1, 1, group*n, m - visible], already
    ``stack_heads``-ed; every row must see at least one of these keys) says so. Returns [1, n, H, d]."""
    batch, heads, n, d = q.shape
    kv_heads = k.shape[1]
    rows = q.reshape(batch, kv_heads, heads // kv_heads * n, d)  # head h = j*group + i -> kv head j, rows i*n..
    near, near_lse = _FLASH_CPU(rows, k[:, :, visible:], v[:, :, visible:], attn_mask=mask, scale=scale)[:2]
    if visible:
        far, far_lse = _FLASH_CPU(rows, k[:, :, :visible], v[:, :, :visible], scale=scale)[:2]
        top = torch.maximum(near_lse, far_lse)  # [1, Hkv, group*n] fp32
        w_near, w_far = (near_lse - top).exp_()[..., None], (far_lse - top).exp_()[..., None]
        near = ((near * w_near + far * w_far) / (w_near + w_far)).to(q.dtype)
    return near.reshape(batch, heads, n, d).transpose(1, 2)
