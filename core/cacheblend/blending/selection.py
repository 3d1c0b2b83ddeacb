"""Token selectors: which reused tokens get recomputed. Pure functions of their inputs.

A selector sees, at a check layer, the candidate tokens (reused tokens still being recomputed)
with their fresh and cached K/V, and returns the indices of the ``budget`` candidates to keep
recomputing. ``blend.py`` decides the budget from the ratio schedule and always keeps every
uncached token on top of what a selector returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from ..config import BlendConfig


@dataclass(frozen=True)
class Candidates:
    """The reused tokens a selector chooses among, at one check layer.

    fresh_k, cached_k: [kv_heads, n, head_dim], keys before RoPE (same positions, so comparable).
    fresh_v, cached_v: [kv_heads, n, head_dim].
    positions: [n] positions in the prompt; chunk_offsets: [n] index of each token in its chunk.
    query_attention: [heads, m, n] fp32, the attention the m question rows (the uncached rows after
        the last reused token) pay each candidate at this layer, softmax over the whole prompt.
        Computed only for selectors whose class sets ``needs_query = True``; None otherwise.
    """

    layer: int
    fresh_k: torch.Tensor
    fresh_v: torch.Tensor
    cached_k: torch.Tensor
    cached_v: torch.Tensor
    positions: torch.Tensor
    chunk_offsets: torch.Tensor
    query_attention: torch.Tensor | None = None


class Selector(Protocol):
    """Returns indices into the candidates (a LongTensor of at most ``budget`` entries)."""

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor: ...


def _top(scores: torch.Tensor, budget: int) -> torch.Tensor:
    budget = max(0, min(budget, scores.numel()))
    return torch.topk(scores, budget, sorted=False).indices


def _rank(scores: torch.Tensor) -> torch.Tensor:
    """Each score's rank scaled to [0, 1) (0 = lowest), a scale-free way to combine scores."""
    ranks = torch.empty_like(scores, dtype=torch.float32)
    ranks[scores.argsort()] = torch.arange(scores.numel(), dtype=torch.float32, device=scores.device)
    return ranks / max(1, scores.numel())


@dataclass(frozen=True)
class DeviationSelector:
    """CacheBlend: the tokens whose fresh K and/or V deviate most from the cached ones.

    The score is the squared L2 distance summed over kv heads and head_dim, computed in fp32.
    """

    measure: str = "v"
    needs_query: ClassVar[bool] = False

    def scores(self, cand: Candidates) -> torch.Tensor:
        score = torch.zeros(cand.positions.shape[0], dtype=torch.float32, device=cand.positions.device)
        if "k" in self.measure:
            score += (cand.fresh_k.float() - cand.cached_k.float()).pow(2).sum(dim=(0, 2))
        if "v" in self.measure:
            score += (cand.fresh_v.float() - cand.cached_v.float()).pow(2).sum(dim=(0, 2))
        return score

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return _top(self.scores(cand), budget)


@dataclass(frozen=True)
class QuerySelector:
    """Query-aware: the tokens the question's rows attend to most at the check layer.

    heads: ``mean`` or ``max`` of the per-head attention mass (summed over the question rows).
    """

    heads: str = "mean"
    needs_query: ClassVar[bool] = True

    def scores(self, cand: Candidates) -> torch.Tensor:
        if cand.query_attention is None:
            raise ValueError("the query selector needs Candidates.query_attention")
        mass = cand.query_attention.sum(dim=1)  # [H, n]
        return mass.amax(dim=0) if self.heads == "max" else mass.mean(dim=0)

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return _top(self.scores(cand), budget)


@dataclass(frozen=True)
class CombinedSelector:
    """Query attention and KV deviation together: ``weight`` * rank(query) + (1 - weight) *
    rank(deviation), ranks scaled to [0, 1)."""

    weight: float = 0.5
    measure: str = "v"
    heads: str = "mean"
    needs_query: ClassVar[bool] = True

    def scores(self, cand: Candidates) -> torch.Tensor:
        query = _rank(QuerySelector(self.heads).scores(cand))
        deviation = _rank(DeviationSelector(self.measure).scores(cand))
        return self.weight * query + (1.0 - self.weight) * deviation

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return _top(self.scores(cand), budget)


@dataclass(frozen=True)
class SinkSelector:
    """EPIC's attention sinks on top of a scoring selector: the first ``sinks`` tokens of every
    chunk first, then the rest of the budget by ``inner``'s scores."""

    inner: DeviationSelector | QuerySelector | CombinedSelector
    sinks: int = 2

    @property
    def needs_query(self) -> bool:
        return self.inner.needs_query

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        score = _rank(self.inner.scores(cand))
        score = score + (cand.chunk_offsets < self.sinks).float()  # sinks rank above every other
        return _top(score, budget)


@dataclass(frozen=True)
class RandomSelector:
    """The ablation: a uniformly random subset, reproducible from ``seed`` and the layer."""

    seed: int = 0

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + cand.layer)
        order = torch.randperm(cand.positions.shape[0], generator=gen)
        return order[: max(0, budget)].to(cand.positions.device)


@dataclass(frozen=True)
class ChunkStartSelector:
    """EPIC-style: the first tokens of every chunk (the attention-sink-like tokens), spread evenly."""

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        # Smaller offset first; ties broken by position so the choice is deterministic.
        score = -(cand.chunk_offsets.double() + cand.positions.double() * 1e-9)
        return _top(score, budget)


@dataclass(frozen=True)
class NoneSelector:
    """Full reuse: recompute no reused token (only uncached ones)."""

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return torch.empty(0, dtype=torch.long, device=cand.positions.device)


@dataclass(frozen=True)
class AllSelector:
    """Full recompute: every token (equals a full prefill)."""

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return torch.arange(cand.positions.shape[0], device=cand.positions.device)


def make_selector(config: BlendConfig) -> Selector:
    """The selector named by ``config.selector`` (with ``config.sinks`` on the scoring ones)."""
    scoring = {
        "deviation": lambda: DeviationSelector(config.measure),
        "query": lambda: QuerySelector(),
        "query+deviation": lambda: CombinedSelector(config.query_weight, config.measure),
    }
    if config.selector in scoring:
        inner = scoring[config.selector]()
        return SinkSelector(inner, config.sinks) if config.sinks else inner
    if config.selector == "random":
        return RandomSelector(config.seed)
    if config.selector == "chunk_start":
        return ChunkStartSelector()
    if config.selector == "none":
        return NoneSelector()
    return AllSelector()
