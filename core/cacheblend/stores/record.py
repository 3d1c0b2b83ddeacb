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
