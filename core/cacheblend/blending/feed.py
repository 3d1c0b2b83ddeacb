"""Chunk KV to the compute device, layer by layer, behind the compute.

Nothing cached is needed before the first check layer, so on CUDA the host -> device copies of
every layer are queued on a side stream when the prefill starts (from pinned host memory, see
``prompts/assemble.py``) and the compute stream waits, per layer, only for the copy of that
layer: layer 0 starts before any KV has arrived and later copies overlap earlier layers.
On CPU (or when the KV already lives on the device) a layer is just indexed.
"""

from __future__ import annotations

import torch


class LayerFeed:
    """cached: [layers, 2, kv_heads, N, head_dim] anywhere; layers from ``first`` on are served."""

    def __init__(self, cached: torch.Tensor, device: torch.device, first: int) -> None:
        self.cached, self.device = cached, device
        self.side = None
        if device.type == "cuda" and cached.device.type == "cpu":
            self.side = torch.cuda.Stream(device)
            self.copies: dict[int, tuple[torch.Tensor, torch.cuda.Event]] = {}
            with torch.cuda.stream(self.side):
                for layer in range(first, cached.shape[0]):
                    dev = cached[layer].to(device, non_blocking=True)  # [2, Hkv, N, d]
                    done = torch.cuda.Event()
                    done.record(self.side)
                    self.copies[layer] = (dev, done)

    def layer(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s cached K/V [2, Hkv, N, d] on the device, in the store's dtype; read-only
        (it may be a view of ``cached``): ``rope.realign`` makes the layer's own copy."""
        if self.side is None:
            return self.cached[layer].to(self.device)
        dev, done = self.copies.pop(layer)
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)  # no host sync: the compute stream waits on the device
        dev.record_stream(current)  # allocated on the side stream, used on this one
        return dev
