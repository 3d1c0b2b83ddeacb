"""Token selectors: which reused tokens get recomputed. Pure functions of their inputs.

A selector sees, at a check layer, the candidate tokens (reused tokens still being recomputed)
with their fresh and cached K/V, and returns the indices of the ``budget`` candidates to keep
recomputing. ``blend.py`` decides the budget from the ratio schedule and always keeps every
uncached token on top of what a selector returns.

A selector whose class sets ``two_stage = True`` (``QuestionSelector``) is not run at a check
layer of the one-pass blend: ``blend.py`` first runs a full-reuse pass over every layer that
scores the reused tokens by the attention the question pays them, then recomputes the selector's
pick from layer 0 (its candidates carry that score as ``question_score``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from .question import Fusion, chunk_ids


@dataclass(frozen=True)
class Candidates:
    """The reused tokens a selector chooses among, at one check layer.

    fresh_k, cached_k: [kv_heads, n, head_dim], keys before RoPE (same positions, so comparable).
    fresh_v, cached_v: [kv_heads, n, head_dim].
    positions: [n] positions in the prompt; chunk_offsets: [n] index of each token in its chunk.
    query_attention: [heads, m, n] fp32, the attention the m question rows (the uncached rows after
        the last reused token) pay each candidate at this layer, softmax over the whole prompt.
        Computed only for selectors whose class sets ``needs_query = True``; None otherwise.
    question_score: [n] fp32, each candidate's score from the first stage of a two-stage blend
        (``QuestionSelector.fuse``); None in the one-pass blend.
    ids: [n] the candidates' token ids; question_ids: [m] those of the question's rows (the
        uncached rows after the last reused token). None where a caller builds candidates without.
    first_alone: ``BlendInput.first_alone`` (the first candidates' chunk is the prompt's first,
        its KV computed behind the chunk context alone).
    """

    layer: int
    fresh_k: torch.Tensor
    fresh_v: torch.Tensor
    cached_k: torch.Tensor
    cached_v: torch.Tensor
    positions: torch.Tensor
    chunk_offsets: torch.Tensor
    query_attention: torch.Tensor | None = None
    question_score: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    question_ids: torch.Tensor | None = None
    first_alone: bool = False

    def chunks(self) -> torch.Tensor:
        """[n] long: each candidate's chunk, 0, 1, ... in prompt order (``question.chunk_ids``)."""
        return chunk_ids(torch.ones_like(self.chunk_offsets, dtype=torch.bool), self.chunk_offsets)


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

    inner: DeviationSelector | QuerySelector | CombinedSelector | QuestionSelector | QuestionDeviationSelector
    sinks: int = 2

    @property
    def needs_query(self) -> bool:
        return self.inner.needs_query

    @property
    def two_stage(self) -> bool:
        return getattr(self.inner, "two_stage", False)

    @property
    def at_check_layers(self) -> bool:
        return getattr(self.inner, "at_check_layers", False)

    @property
    def fusion(self) -> Fusion | None:
        return getattr(self.inner, "fusion", None)

    @property
    def needs_gap(self) -> bool:  # both records read (``DraftSelector(gap=True)``)
        return getattr(self.inner, "needs_gap", False)

    @property
    def first_stage(self):  # a drafted stage 1 (``DraftSelector``) or None: the blend's own
        return getattr(self.inner, "first_stage", None)

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        score = _rank(self.inner.scores(cand))
        score = score + (cand.chunk_offsets < self.sinks).float()  # sinks rank above every other
        return _top(score, budget)


@dataclass(frozen=True)
class QuestionSelector:
    """ProphetKV-style (arXiv 2602.02579): the reused tokens the question attends to most over
    the whole depth of the model, found by a first pass before anything is recomputed.

    Two-stage (``two_stage``): ``blend.py`` runs stage 1, a full-reuse pass from layer 0 (only the
    uncached rows and the last row, every layer, over the realigned cached K/V) that takes at each
    layer the softmax attention of the question rows (the uncached rows after the last reused
    token, at least the last row) over every prompt key; ``question.Fusion`` makes it one score
    per token (``layers``: all, last_third or last; ``heads``: mean or max; ``per_chunk``). Stage 2
    recomputes from layer 0 the uncached rows, the last row and the ``budget`` reused tokens of
    highest score, at every layer. The config's check layers play no part, only its last ratio
    (the recompute ratio) does; ``fresh_check`` has no effect.
    """

    layers: str = "all"
    heads: str = "mean"
    per_chunk: bool = False
    needs_query: ClassVar[bool] = False
    two_stage: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.fusion  # noqa: B018 (validates the fusion knobs)

    @property
    def fusion(self) -> Fusion:
        return Fusion(self.layers, self.heads, self.per_chunk)

    def layer_set(self, num_layers: int) -> range:
        return self.fusion.layer_set(num_layers)

    def scores(self, cand: Candidates) -> torch.Tensor:
        return _question_score(cand)

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return _top(self.scores(cand), budget)


def _question_score(cand: Candidates) -> torch.Tensor:
    if cand.question_score is None:
        raise ValueError("the question selectors need Candidates.question_score (a two-stage blend)")
    return cand.question_score


@dataclass(frozen=True)
class QuestionDeviationSelector:
    """The question's stage-1 score and KV deviation by weighted rank: ``weight`` * rank(question)
    + (1 - weight) * rank(deviation), ranks in [0, 1). Stage 1 as ``QuestionSelector``'s; stage 2
    is the one-pass blend of the config's schedule (``at_check_layers``: a full-prefill prelude
    before the first check layer, where fresh K/V to compare exist): stage 1 on top of deviation's cost.
    """

    weight: float = 0.5
    measure: str = "v"
    layers: str = "all"
    heads: str = "mean"
    per_chunk: bool = False
    needs_query: ClassVar[bool] = False
    two_stage: ClassVar[bool] = True
    at_check_layers: ClassVar[bool] = True

    @property
    def fusion(self) -> Fusion:
        return Fusion(self.layers, self.heads, self.per_chunk)

    def scores(self, cand: Candidates) -> torch.Tensor:
        question = _rank(_question_score(cand))
        return self.weight * question + (1.0 - self.weight) * _rank(DeviationSelector(self.measure).scores(cand))

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        return _top(self.scores(cand), budget)


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
