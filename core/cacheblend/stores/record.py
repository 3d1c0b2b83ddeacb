"""The stored record of one chunk's KV, its layout version, and the warning every store raises.

Layout of a record's tensor (LAYOUT_VERSION 1): ``[layers, 2, kv_heads, tokens, head_dim]``,
index 0 of dim 1 is K *before RoPE*, index 1 is V, in the configured KV dtype. Every store tier
(memory, disk, a remote one) keeps and returns these records unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUT_VERSION = 1


class StoreWarning(UserWarning):
    """A store could not read or write a chunk; the engine recomputes instead."""


@dataclass(frozen=True)
class ChunkRecord:
    """One chunk's cached KV. key: its ChunkKey; kv: [layers, 2, kv_heads, tokens, head_dim];
    text: the chunk text (stored so a new process can find the chunk in prompts)."""

    key: str
    kv: torch.Tensor
    text: str

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def toward(self, other: ChunkRecord, weight: float) -> ChunkRecord:
        """This record moved ``weight`` of the way to ``other`` (the same chunk's other record:
        0 is this one, 1 ``other``; outside [0, 1] it extrapolates), computed in fp32 and stored in this record's dtype, keyed as
        this one. The chunks after the one a question names read ``plain.toward(lead, w)``
        (``BlendConfig.lead_after_named``)."""
        if other.kv.shape != self.kv.shape:
            shapes = f"{tuple(self.kv.shape)} vs {tuple(other.kv.shape)}"
            raise ValueError(f"records of one chunk have one shape: {shapes}")
        a, b = self.kv.float(), other.kv.float()
        return ChunkRecord(self.key, (b + (1 - weight) * (a - b)).to(self.kv.dtype), self.text)
