"""Batched decoding: one forward per step for every active sequence; the only decode step.

The decode loop (``lockstep.Lockstep``) steps its answers through it: one slot for a streamed
answer, one per prefill for ``generate_many``, one per active request in the server, so all share
one decode path (transformers' own ``forward`` stays only as the tests' reference and in
``Prefilled.continuation_logits``, a quality measure).

Each active sequence owns a slot: one row of per-layer K/V buffers ``[rows, kv_heads, capacity,
head_dim]`` holding its prompt's (blended) KV and every token decoded since. Active sequences are
kept in slots ``0..count-1`` (a finished one is replaced by the last), so a step works on views of
the first rows, never on a gathered copy. Rows have different lengths: attention masks each row to
its own keys (``ModelAdapter.attend_step``), so a row's result does not depend on its neighbours.
"""

from __future__ import annotations

import torch

from ..models.adapter import ModelAdapter
from ..blending.rope import RopeTables, apply_rope

_ROUND = 256  # capacity grows in steps of this many positions


class SlotKV:
    """KV buffers of up to ``slots`` sequences and the batched decode step over them."""

    def __init__(self, adapter: ModelAdapter, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.adapter = adapter
        self.slots = slots
        self.capacity = 0
        self.rows = 0  # slots the buffers hold so far
        self.count = 0
        self.lengths: list[int] = []  # tokens held per active slot
        self.k: list[torch.Tensor] = []  # per layer [slots, Hkv, capacity, d], keys after RoPE
        self.v: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def _ensure(self, need: int, rows: int = 0) -> None:
        """Grows the buffers to hold ``need`` positions in each of ``rows`` slots (copying what they
        hold). Rows are allocated as slots fill (doubling, up to ``slots``), so a loop allowed many
        answers but running one holds one row."""
        if need <= self.capacity and rows <= self.rows:
            return
        cap = self.capacity
        if need > cap:
            cap = min(max(need, 2 * cap), self.adapter.max_positions)
            cap = max(need, -(-cap // _ROUND) * _ROUND)
        held = self.rows
        if rows > held:
            self.rows = min(self.slots, max(rows, 2 * held))
        a = self.adapter
        shape = (self.rows, a.num_kv_heads, cap, a.head_dim)
        for buffers in (self.k, self.v):
            for layer in range(a.num_layers):
                new = torch.zeros(shape, dtype=a.dtype, device=a.device)
                if buffers and self.capacity:
                    new[:held, :, : self.capacity] = buffers[layer]
                if len(buffers) < a.num_layers:
                    buffers.append(new)
                else:
                    buffers[layer] = new
        self.capacity = cap

    @torch.inference_mode()
    def add(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Places a prompt's per-layer (K after RoPE [1,Hkv,N,d], V [1,Hkv,N,d]); returns its slot."""
        if self.count == self.slots:
            raise RuntimeError("every slot is taken")
        self.lengths.append(0)
        self.count += 1
        self.put(self.count - 1, kv)
        return self.count - 1

    @torch.inference_mode()
    def put(self, slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Replaces what active ``slot`` holds with per-layer (K after RoPE [1,Hkv,n,d], V [1,Hkv,n,d])."""
        if not 0 <= slot < self.count:
            raise ValueError(f"slot {slot} is not active ({self.count} are)")
        n = kv[0][0].shape[2]
        self._ensure(n + 1, self.count)
        for layer, (k, v) in enumerate(kv):
            self.k[layer][slot, :, :n] = k[0]
            self.v[layer][slot, :, :n] = v[0]
        self.lengths[slot] = n

    def held(self, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Views of what ``slot`` holds: per layer (K [1,Hkv,n,d], V [1,Hkv,n,d]), n its length."""
        n = self.lengths[slot]
        return [(k[slot : slot + 1, :, :n], v[slot : slot + 1, :, :n]) for k, v in zip(self.k, self.v)]

    @torch.inference_mode()
    def remove(self, slot: int) -> None:
        """Frees ``slot``; the last active slot moves into it (callers mirror that move)."""
        last = self.count - 1
        if slot != last:
            n = self.lengths[last]
            for buffers in (self.k, self.v):
                for t in buffers:
                    t[slot, :, :n] = t[last, :, :n]
            self.lengths[slot] = n
        self.lengths.pop()
        self.count -= 1

    @torch.inference_mode()
    def step(self, tokens: list[int]) -> torch.Tensor:
        """Feeds token ``tokens[b]`` to slot b (for every active slot); next-token logits [B, vocab] fp32."""
        a, b = self.adapter, self.count
        if len(tokens) != b:
            raise ValueError(f"{len(tokens)} tokens for {b} active slots")
        self._ensure(max(self.lengths) + 1)
        width = max(self.lengths) + 1
        pos = torch.tensor(self.lengths, device=a.device)  # [B] position of each new token
        rows = torch.arange(b, device=a.device)
        tables = RopeTables.at(a, pos).map(lambda t: t[:, None, None])  # [B, 1, 1, d]: one position per row
        h = a.embed(torch.tensor(tokens, device=a.device)[:, None])  # [B, 1, hidden]
        for layer in range(a.num_layers):
            q, k, v = a.qkv(layer, h)  # q [B,H,1,d]; k, v [B,Hkv,1,d]
            cos, sin = tables.layer(layer)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            keys, values = self.k[layer], self.v[layer]
            keys[rows, :, pos] = k[:, :, 0]  # [B, Hkv, d] written at each row's position
            values[rows, :, pos] = v[:, :, 0]
            attn = a.attend_step(layer, q, keys[:b, :, :width], values[:b, :, :width], pos)  # [B,1,H*d]
            h = a.finish(layer, h, attn)
        self.lengths = [n + 1 for n in self.lengths]
        return a.logits(h[:, -1])  # [B, vocab]
