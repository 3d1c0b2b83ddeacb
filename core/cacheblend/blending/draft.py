"""The ``draft`` selector: the question selector's score read from a drafted answer's own rows.

Why: the question selector (``QuestionSelector``) recomputes the reused tokens the question's rows
attend to most over the model's depth. Its misses are answers that read elsewhere than the question
did: the question names an organisation, and the value token ("founded in 18..") reads a passage the
question never looked at. The answer comes after the prefill, but a draft of it does not: full
reuse of the same records gives one. Scoring the draft's rows kept more development answers than
scoring the question's on both real models (docs/DRAFT-SCORE.md).

Stage 1 (``draft_stage``, which replaces ``blend._first_stage``): the full-reuse pass, then
``tokens`` greedy tokens decoded over its cache, one row each; at the fused layers each draft row's
attention over the prompt's keys is summed into the score (with ``question``, the question rows'
attention in the full-reuse pass too). The draft is full reuse's own answer, right or wrong, and does
not stop at an end token. Stage 2 is the question selector's, over the full-reuse pass's caches of
the prompt's rows: the draft's K/V are dropped, never decoded from.

Cost: ``tokens`` rows more than the question selector's stage 1 (``BlendStats.first_stage_tokens``
counts them; ``first_stage_active`` holds their positions, so ``tools/cost.py`` counts their work).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import MAX_DRAFT_TOKENS
from ..models.adapter import ModelAdapter
from .blend import BlendOutput, reuse_pass
from .check import Check
from .inputs import BlendInput
from .question import Fusion, QuestionScore
from .rope import RopeTables, apply_rope
from .rows import Rows, attend_rows
from .selection import NoneSelector, QuestionSelector


class DraftScore(QuestionScore):
    """``QuestionScore`` over the prompt's N keys, whose asking rows include draft rows past N;
    ``draft``: the drafted token ids."""

    def __init__(self, model: ModelAdapter, asking: torch.Tensor, fusion: Fusion, keys: int) -> None:
        super().__init__(model, asking, fusion, keys)
        self.draft: list[int] = []


def draft_stage(model: ModelAdapter, inp: BlendInput, fusion: Fusion, tokens: int,
                question: bool = False) -> tuple[BlendOutput, DraftScore]:
    """Stage 1 with a drafted answer (the module docstring). Returns the full-reuse pass's output
    over the prompt's N rows, with the draft rows added to ``recomputed`` and to every layer's
    ``active_rows`` (positions N..N+tokens-1), and the score, whose ``draft`` holds the tokens."""
    check_tokens(tokens)
    n, device = inp.ids.shape[0], inp.ids.device
    asking = Check.of(inp, NoneSelector()).asking if question else inp.reused.new_zeros(n)
    asked = DraftScore(model, torch.cat([asking, asking.new_ones(tokens)]), fusion, keys=n)
    first = reuse_pass(model, inp, asked if question else None)
    tables = RopeTables.at(model, torch.arange(n + tokens, device=device))
    caches = [_grown(k[0], v[0], tokens) for k, v in first.kv]  # per layer [2,Hkv,N+T,d]
    asked.draft.append(int(first.logits.argmax()))
    for at in range(n, n + tokens):
        logits = _row(model, caches, asked.draft[-1], at, tables, asked)
        if len(asked.draft) < tokens:
            asked.draft.append(int(logits.argmax()))
    drafted = torch.arange(n, n + tokens, device=device)
    first.active_rows = [torch.cat([rows, drafted]) for rows in first.active_rows]
    first.recomputed, first.drafted = first.recomputed + tokens, tokens
    return first, asked


def check_tokens(tokens: object) -> None:
    """ValueError unless ``tokens`` is an integer in [1, MAX_DRAFT_TOKENS]."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_DRAFT_TOKENS:
        raise ValueError(f"draft tokens must be an integer in [1, {MAX_DRAFT_TOKENS}], got {tokens!r}")


def _grown(k: torch.Tensor, v: torch.Tensor, tokens: int) -> torch.Tensor:
    """K and V [Hkv,N,d] in one new buffer [2,Hkv,N+tokens,d], zeros in the room for the draft's
    rows (one copy of the pass's K/V)."""
    out = k.new_empty((2, k.shape[0], k.shape[1] + tokens, k.shape[2]))
    out[0, :, : k.shape[1]], out[1, :, : k.shape[1]] = k, v
    out[:, :, k.shape[1]:] = 0
    return out


def _row(model: ModelAdapter, caches: list[torch.Tensor], token: int, at: int, tables: RopeTables,
         observe: QuestionScore) -> torch.Tensor:
    """One decoding step: the row of ``token`` at position ``at`` over the rows before it in
    ``caches`` (per layer [2,Hkv,N',d], rotated K and V), its K/V written there, ``observe``d at
    every layer as the blend's passes are. Returns its logits [vocab]."""
    rows = Rows.at(torch.tensor([at], device=caches[0].device), tables)
    h = model.embed(torch.tensor([[token]], device=caches[0].device))  # [1, 1, hidden]
    for layer, kv in enumerate(caches):
        cos, sin = rows.rope.layer(layer)  # [1, d]
        x = model.attn_input(layer, h)
        k, v = model.kv(layer, x)  # [1,Hkv,1,d], k before RoPE
        kv[0, :, at] = apply_rope(k[0], cos, sin)[:, 0]
        kv[1, :, at] = v[0, :, 0]
        q = apply_rope(model.q(layer, x), cos, sin)  # [1,H,1,d]
        keys, values = kv[0][None], kv[1][None]
        observe(layer, q, keys, rows.active)
        h = model.finish(layer, h, attend_rows(model, layer, q, keys, values, rows.plan))
    return model.logits(h[0, -1])


@dataclass(frozen=True)
class DraftSelector(QuestionSelector):
    """The question selector whose stage 1 is ``draft_stage``: the top of the score the ``tokens``
    draft rows (and with ``question`` the question's rows) pay, recomputed from layer 0."""

    tokens: int = 8
    question: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tokens(self.tokens)

    def first_stage(self, model: ModelAdapter, inp: BlendInput) -> tuple[BlendOutput, DraftScore]:
        return draft_stage(model, inp, self.fusion, self.tokens, self.question)
