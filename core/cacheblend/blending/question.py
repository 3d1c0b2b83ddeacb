"""The question-driven score of a two-stage blend (ProphetKV-style, arXiv 2602.02579).

Stage 1 of the blend (``blend._two_stage``) is a full-reuse pass; at each layer ``QuestionScore``
takes the softmax attention the question rows pay every prompt key (``question_mass``), and
``Fusion`` turns those per-layer, per-head masses into one score per reused token. The selectors
that use it (``QuestionSelector``, ``QuestionDeviationSelector``) live in ``selection.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.adapter import ModelAdapter

LAYERS = ("all", "last_third", "last")
HEADS = ("mean", "max")


@dataclass(frozen=True)
class Fusion:
    """How stage 1's attention becomes one score per token: the question rows' mass summed over
    those rows, reduced over heads (``heads``: mean or max), averaged over ``layers`` (``all``,
    ``last_third``: the last ceil(L/3), ``last``), and with ``per_chunk`` divided by its chunk's
    total (every chunk then holds the same score mass)."""

    layers: str = "all"
    heads: str = "mean"
    per_chunk: bool = False

    def __post_init__(self) -> None:
        if self.layers not in LAYERS or self.heads not in HEADS:
            raise ValueError(f"question layers must be one of {LAYERS} and heads one of {HEADS}; "
                             f"got {self.layers!r}, {self.heads!r}")

    def layer_set(self, num_layers: int) -> range:
        """The layers whose question attention is fused."""
        if self.layers == "all":
            return range(num_layers)
        return range(num_layers - (-(-num_layers // 3) if self.layers == "last_third" else 1), num_layers)

    def reduce_heads(self, mass: torch.Tensor) -> torch.Tensor:
        """mass: [H, N], the attention each head's question rows pay each key -> [N]."""
        return mass.amax(dim=0) if self.heads == "max" else mass.mean(dim=0)

    def fuse(self, per_layer: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
        """per_layer: [L', N] fp32, ``reduce_heads`` of each fused layer; chunks: [N] long, each
        reused token's chunk (``chunk_ids``), -1 elsewhere. The score [N] (meaningful at reused
        tokens only)."""
        score = per_layer.mean(dim=0)  # [N]
        mine = chunks >= 0
        if not self.per_chunk or not bool(mine.any()):
            return score
        totals = torch.zeros(int(chunks.max()) + 1, dtype=score.dtype, device=score.device)
        totals.scatter_add_(0, chunks[mine], score[mine])
        out = score.clone()
        out[mine] = score[mine] / totals[chunks[mine]].clamp_min(torch.finfo(score.dtype).tiny)
        return out


def chunk_ids(reused: torch.Tensor, chunk_offsets: torch.Tensor) -> torch.Tensor:
    """[N] long: the chunk (0, 1, ... in prompt order) of each reused token, -1 for uncached ones.
    Offsets rise strictly inside a chunk (a hole of retokenized tokens only skips some), so a reused
    token whose offset is not above the previous reused token's starts a chunk. (Two adjacent
    chunks would read as one only if the second's first reused offset were above the first's last.)"""
    idx = reused.nonzero().flatten()
    out = torch.full(reused.shape, -1, dtype=torch.long, device=reused.device)
    if idx.numel() == 0:
        return out
    offsets = chunk_offsets[idx]
    starts = torch.ones_like(offsets, dtype=torch.long)
    starts[1:] = (offsets[1:] <= offsets[:-1]).long()
    out[idx] = starts.cumsum(0) - 1
    return out


def question_mass(model: ModelAdapter, layer: int, q: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
    """The attention mass [H, N] fp32 the m rows at ``q_pos`` [m] pay each of the N keys, summed
    over the rows: a softmax over the keys each row sees (causal by position, within the layer's
    sliding window). q: [H, m, d] rotated; keys: [Hkv, N, d] rotated. m*N scores per head (the
    question rows only, no N*N); each kv head serves its group of query heads without a copy."""
    heads, m, d = q.shape
    kv_heads, num_keys = keys.shape[0], keys.shape[1]
    grouped = q.float().reshape(kv_heads, (heads // kv_heads) * m, d)  # head h reads kv head h // group
    scores = (grouped @ keys.float().transpose(1, 2)).view(heads, m, num_keys) * model.scaling  # [H, m, N]
    k_pos = torch.arange(num_keys, device=q.device)[None, :]
    seen = k_pos <= q_pos[:, None]  # [m, N]
    window = model.window(layer)
    if window is not None:
        seen &= k_pos > q_pos[:, None] - window
    return scores.masked_fill(~seen, float("-inf")).softmax(dim=-1).sum(dim=1)  # [H, N]


class QuestionScore:
    """Stage 1's observer: at each layer ``fusion`` fuses, the attention the question rows
    (``asking`` [N'] bool over positions) pay the first ``keys`` prompt keys (all: None), reduced
    over heads. Calls for the same layer add up (a drafted answer's rows come one by one: ``draft.py``)."""

    def __init__(self, model: ModelAdapter, asking: torch.Tensor, fusion: Fusion, keys: int | None = None) -> None:
        self.model, self.asking, self.fusion, self.keys = model, asking, fusion, keys
        self.wanted = set(fusion.layer_set(model.num_layers))
        self.mass: dict[int, torch.Tensor] = {}  # fused layer -> [H, N], summed over its calls
        self.rows = 0  # the rows scored

    def __call__(self, layer: int, q: torch.Tensor, keys: torch.Tensor, active: torch.Tensor) -> None:
        """q: [1,H,n,d] rotated queries of the rows ``active`` [n]; keys: [1,Hkv,N',d]."""
        if layer not in self.wanted:
            return
        mine = self.asking[active]  # [n] bool
        mass = question_mass(self.model, layer, q[0][:, mine], keys[0], active[mine])[:, : self.keys]  # [H, N]
        self.mass[layer] = self.mass[layer] + mass if layer in self.mass else mass
        if layer == min(self.wanted):
            self.rows += int(mine.sum())

    @property
    def layers(self) -> list[int]:
        """The fused layers seen."""
        return sorted(self.mass)

    def score(self, reused: torch.Tensor, chunk_offsets: torch.Tensor) -> torch.Tensor:
        """The fused score [N] of the layers seen."""
        per_layer = torch.stack([self.fusion.reduce_heads(self.mass[layer]) for layer in self.layers])
        return self.fusion.fuse(per_layer, chunk_ids(reused, chunk_offsets))
