"""The lexical selector: the chunks the question names are recomputed whole.

On lookups over passages alike in form (the generated facts: every passage states a founding
year, a founder and a city in the same sentences), a blend's wrong answers name a value of
another passage or another attribute of the right one (QUALITY-NOTES): the question reads the
asked passage's KV, computed without the rest of the prompt, and binds to a distractor's similar
sentence. The question's rarer tokens say which passage it asks about, at no cost: recomputing
that passage whole gives it KV computed over the whole prompt, as full prefill's is. Measured
against deviation, full reuse of the same records and the rest on both real models in
docs/LEXICAL-SELECTOR.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .question import Fusion, chunk_ids
from .selection import Candidates, DeviationSelector, _rank, _top


def chunk_scores(ids: torch.Tensor, chunk: torch.Tensor, question_ids: torch.Tensor) -> torch.Tensor:
    """[chunks] float: per chunk, the sum over the distinct ``question_ids`` it holds of
    log(chunks / chunks holding that id). ``ids``, ``chunk``: [n] the reused tokens' ids and
    chunks (0, 1, ... in prompt order)."""
    n = int(chunk.max()) + 1 if chunk.numel() else 0
    asked = question_ids.unique()  # [m']
    found = (ids[:, None] == asked[None, :]).float()  # [n, m']
    holds = torch.zeros(n, asked.numel(), device=chunk.device).index_add_(0, chunk, found) > 0  # [chunks, m']
    df = holds.sum(0).clamp_min(1).float()  # chunks holding each question id
    return (holds.float() * torch.log(n / df)).sum(1)  # [chunks]


def named_chunk(scores: torch.Tensor, first_alone: bool = False) -> int | None:
    """The chunk the question names most (the best of ``chunk_scores``), or None: it names none,
    or it names the first chunk and that one's KV was computed behind the chunk context alone
    (``first_alone``). Full prefill computes the prompt's first passage behind nothing but the
    prompt's head too, so recomputing it gives it no context it lacks; on the development facts
    with the answer's passage first, recomputing it whole kept no more answers than 5% by
    deviation, at a higher KL, on both models (docs/LEXICAL-SELECTOR.md).

    Chunks that tie (a multi-hop question names an entity two passages hold: over half of
    MuSiQue's prompts) name the first of them, the retriever's better match where chunks come
    best first; the first chunk read alone among them names none. The selector, the budget and the
    lead records all follow this one choice. On Qwen's MuSiQue development prompts the first kept
    more answers at a lower KL than the last, than none and than the one deviating most
    (docs/LEXICAL-SELECTOR.md, "Ties")."""
    if scores.numel() == 0 or float(scores.max()) <= 0:
        return None
    best = int(scores.argmax())  # the first of the best
    return None if best == 0 and first_alone else best


def lead_margin(scores: torch.Tensor) -> float:
    """How far the best of ``chunk_scores`` leads the next best, as a share of the best: 1 when one
    chunk alone holds the question's tokens, 0 on a tie (or when the question names none)."""
    if scores.numel() == 0 or float(scores.max()) <= 0:
        return 0.0
    top = scores.topk(min(2, scores.numel())).values
    return 1.0 if top.numel() == 1 else float((top[0] - top[1]) / top[0])


def named_before_blend(chunks: list[list[int]], question_ids: list[int], margin: float = 0.0) -> int | None:
    """``named_chunk`` of a prompt's chunks (token ids, prompt order; the first read alone) before
    any record is read, None where it leads the next chunk by less than ``margin`` (``lead_margin``):
    what ``BlendConfig(lead_after_named=..., lead_after_margin=margin)`` reads its records by."""
    if not chunks or not question_ids:
        return None
    ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long)
    chunk = torch.tensor([i for i, c in enumerate(chunks) for _ in c], dtype=torch.long)
    scores = chunk_scores(ids, chunk, torch.tensor(question_ids, dtype=torch.long))
    return named_chunk(scores, first_alone=True) if lead_margin(scores) >= margin else None


def named_share(ids: torch.Tensor, chunk: torch.Tensor, question_ids: torch.Tensor, first_alone: bool = False) -> float:
    """The share of the ``n`` reused tokens held by the chunk the question names (``named_chunk``;
    0 when there is none): the budget that recomputes that chunk whole (``auto_signal="named_share"``)."""
    best = named_chunk(chunk_scores(ids, chunk, question_ids), first_alone)
    return 0.0 if best is None else float((chunk == best).sum()) / chunk.numel()


@dataclass(frozen=True)
class LexicalSelector:
    """What the question names: the chunks holding the question's tokens are recomputed whole,
    the best first, within ``share`` of the budget (by KV deviation inside a chunk that does not fit
    whole); the rest of the budget goes by KV deviation over every chunk.

    A chunk's score is the sum, over the distinct question token ids it holds, of log(chunks /
    chunks holding that id): an id every chunk holds (a shared word, the passages' common
    pattern) weighs nothing, a name only one passage holds weighs most. So the passage the
    question asks about is read with KV computed over the whole prompt, where a distractor's
    similar sentence would otherwise bind the answer (docs/LEXICAL-SELECTOR.md). When the chunk
    it names most is the prompt's first, read alone (``Candidates.first_alone``), it names none:
    the whole budget goes by deviation (``named_chunk``)."""

    measure: str = "v"
    share: float = 1.0  # of the budget, for the named chunks; the rest by deviation over every chunk
    needs_query: ClassVar[bool] = False

    def scores(self, cand: Candidates, deviation: torch.Tensor | None = None) -> torch.Tensor:
        """The named chunks' rank (1 + rank, 0 for a chunk naming nothing) plus each token's deviation
        rank in [0, 1); ``deviation``: its V deviation scores, when the caller has them already."""
        if cand.ids is None or cand.question_ids is None:
            raise ValueError("the lexical selector needs Candidates.ids and Candidates.question_ids")
        chunk = cand.chunks()  # [n]
        chunk_score = chunk_scores(cand.ids, chunk, cand.question_ids)  # [chunks]
        best = named_chunk(chunk_score, cand.first_alone)
        if best is None:  # it names nothing recomputing helps: deviation
            chunk_score = torch.zeros_like(chunk_score)
        n = chunk_score.numel()
        rank = torch.empty(n, dtype=torch.float32, device=chunk.device)
        rank[chunk_score.argsort(stable=True)] = torch.arange(n, dtype=torch.float32, device=chunk.device)
        if best is not None:  # the named chunk first, whatever ties it: the named share is sized for it
            rank[best] = float(n)
        prio = torch.where(chunk_score[chunk] > 0, 1.0 + rank[chunk], 0.0)  # better chunks higher, whole
        deviation = DeviationSelector(self.measure).scores(cand) if deviation is None else deviation
        return prio + _rank(deviation)  # deviation in [0, 1) inside

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        budget = min(budget, cand.positions.numel())
        deviation = DeviationSelector(self.measure).scores(cand)  # one computation for both parts
        named = _top(self.scores(cand, deviation), round(budget * self.share))
        if named.numel() >= budget:
            return named
        rest = deviation.clone()
        rest[named] = -1.0  # deviations are >= 0: the named tokens are not picked twice
        return torch.cat([named, _top(rest, budget - named.numel())])


@dataclass(frozen=True)
class LexicalQuestionSelector:
    """``selector="lexical+question"``: the lexical selector where the question names a chunk;
    where it names none (``named_chunk``: no chunk holds a rarer question token, or the best is the
    prompt's first chunk read alone, as when a multi-hop question names two passages alike and
    the first is one of them), the budget goes by the attention the question pays each reused
    token over the model's depth (the question selector's stage 1, fused by ``fusion``) instead
    of by V deviation. Only those prompts pay stage 1 (``stage_one_for``); stage 2 is the one-pass
    blend of the config's schedule over stage 1's caches (``at_check_layers``), picking the fused
    score's top. Where the named chunk had nothing to name, deviation at check layer 1 barely
    beat full reuse on Qwen's long prompts and the question's score did (docs/QUESTION-SELECTOR.md)."""

    lexical: LexicalSelector
    fusion: Fusion
    skip_first: bool = False  # rank the first chunk's lead record last (off: its rule failed, QUESTION-SELECTOR.md)
    needs_query: ClassVar[bool] = False
    at_check_layers: ClassVar[bool] = True

    def stage_one_for(self, ids: torch.Tensor, reused: torch.Tensor, chunk_offsets: torch.Tensor,
                      asking: torch.Tensor, first_alone: bool) -> bool:
        """Whether this prompt needs stage 1: its question names no chunk. ids, reused,
        chunk_offsets, asking: [N], the prompt's (``BlendInput``; asking: the question's rows)."""
        chunk = chunk_ids(reused, chunk_offsets)[reused]
        return named_chunk(chunk_scores(ids[reused], chunk, ids[asking]), first_alone) is None

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        if cand.question_score is None:
            return self.lexical(cand, budget)
        score = cand.question_score
        if self.skip_first and cand.first_alone:  # its KV has full prefill's context already
            first = cand.chunks() == 0
            score = score.masked_fill(first, float("-inf"))
        return _top(score, budget)
