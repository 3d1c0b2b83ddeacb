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

Drafting passes: a one-row pass reads every weight of the model for one token, so on a CPU (and on
a GPU) it costs far more than its share of a prefill's rows. Each pass therefore also computes the
rows of up to ``lookahead`` guessed next tokens (``prompt_lookup``: what follows the draft's last
tokens where they occur in the prompt, since an answer copies its values from the passages) and
keeps those that greedy decoding confirms, and the token after them, which its logits give: the
draft is the same greedy draft (the same tokens, their rows scored alike), in fewer passes. A
rejected guess's row is computed, not scored, and overwritten by the next pass.

Cost: the draft's rows more than the question selector's stage 1, a rejected guess's included
(``BlendStats.first_stage_tokens`` counts them; ``first_stage_active`` holds their positions, so
``tools/cost.py`` counts their work).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import MAX_DRAFT_TOKENS
from ..models.adapter import ModelAdapter
from .blend import BlendOutput, reuse_pass
from .check import Check
from .inputs import BlendInput
from .lexical import LexicalQuestionSelector
from .question import Fusion, QuestionScore
from .rope import RopeTables, apply_rope
from .rows import Rows, attend_rows
from .selection import NoneSelector, QuestionSelector

LOOKAHEAD = 7  # guesses a drafting pass verifies at most (``prompt_lookup``'s); 0: one token per pass


class DraftScore(QuestionScore):
    """``QuestionScore`` over the prompt's N keys, whose asking rows include draft rows past N;
    ``draft``: the drafted token ids; ``weight``: [N], what the score is multiplied by (the rows'
    gap, ``gap.py``: ``DraftSelector(gap=True)``), or None; ``margins``: per drafted token, how sure full
    reuse was of it (``token_margins``), the signal an adaptive budget can read before stage 2."""

    def __init__(self, model: ModelAdapter, asking: torch.Tensor, fusion: Fusion, keys: int) -> None:
        super().__init__(model, asking, fusion, keys)
        self.draft: list[int] = []
        self.passes = 0  # the drafting passes (``draft_stage``)
        self.weight: torch.Tensor | None = None
        self.margins: list[float] = []

    def score(self, reused: torch.Tensor, chunk_offsets: torch.Tensor) -> torch.Tensor:
        score = super().score(reused, chunk_offsets)
        return score if self.weight is None else score * self.weight.to(score.device)


Propose = Callable[[list[int], int], list[int]]  # (the draft so far, at most how many) -> guessed next tokens


def draft_stage(model: ModelAdapter, inp: BlendInput, fusion: Fusion, tokens: int, question: bool = False,
                guesses: int | Propose = LOOKAHEAD) -> tuple[BlendOutput, DraftScore]:
    """Stage 1 with a drafted answer (the module docstring). Returns the full-reuse pass's output
    over the prompt's N rows, with every row the drafting passes computed added to ``recomputed``
    and to every layer's ``active_rows`` (positions N..N+tokens-1; a rejected guess's position once
    more), and the score, whose ``draft`` holds the tokens and ``passes`` the drafting passes.
    ``guesses``: how many of ``prompt_lookup``'s guesses a pass verifies at most (0: none, a token
    per pass), or a ``Propose`` of its own, asked for as many as the draft has room for. The
    drafting passes write their rows into the room the full-reuse pass left after the prompt's in
    each layer's cache (``BlendOutput.grown``): the prompt's K/V are not copied for them."""
    check_tokens(tokens)
    n, device = inp.ids.shape[0], inp.ids.device
    asking = Check.of(inp, NoneSelector()).asking if question else inp.reused.new_zeros(n)
    asked = DraftScore(model, torch.cat([asking, asking.new_ones(tokens)]), fusion, keys=n)
    first = reuse_pass(model, inp, asked if question else None, room=tokens)
    tables = RopeTables.at(model, torch.arange(n + tokens, device=device))
    caches = first.grown  # per layer [2,Hkv,N+T,d]: the pass's K/V, then the draft's rows
    for cache in caches:
        cache[:, :, n:] = 0
    propose, lookahead = (guesses, tokens) if callable(guesses) else (prompt_lookup(inp.ids), guesses)
    draft, done, computed = [int(first.logits.argmax())], 0, []  # done: the draft's rows kept
    margins = [token_margins(first.logits[None])]  # on the device: read back once, after the last pass
    while done < tokens:  # draft[done] is known, its row not computed yet
        room = min(lookahead, tokens - len(draft))
        guess = propose(draft, room)[:room] if room else []
        positions = torch.arange(n + done, n + done + 1 + len(guess), device=device)
        logits, seen = feed(model, caches, draft[done:] + guess, positions, tables)
        picks = logits.argmax(dim=-1).tolist()
        kept = 1  # rows whose token is verified: the known one and the guesses greedy decoding agrees with
        while kept <= len(guess) and picks[kept - 1] == guess[kept - 1]:
            kept += 1
        for layer, q, keys in seen:  # a rejected guess's row is neither scored nor kept
            asked(layer, q[:, :, :kept], keys, positions[:kept])
        draft, done = draft + guess[: kept - 1], done + kept
        margins.append(token_margins(logits[:kept]))  # the rows that picked the draft's new tokens (and one past it)
        if len(draft) < tokens:
            draft.append(picks[kept - 1])
        computed.append(positions)
        asked.passes += 1
    asked.draft, asked.margins = draft, torch.cat(margins)[:tokens].tolist()
    drafted = torch.cat(computed)
    first.active_rows = [torch.cat([rows, drafted]) for rows in first.active_rows]
    first.recomputed, first.drafted = first.recomputed + drafted.shape[0], tokens
    return first, asked


def prompt_lookup(ids: torch.Tensor, longest: int = 3) -> Propose:
    """The guesses of prompt lookup: the tokens that follow, in the prompt ``ids`` [N], the latest
    occurrence of the draft's last ``longest`` tokens (of fewer where those do not occur; the
    prompt's own tokens before the draft count as the draft's past). A RAG answer copies its values
    from the passages, so the guesses are often what greedy decoding picks."""
    prompt = ids.tolist()
    where: dict[int, list[int]] = {}
    for i, token in enumerate(prompt[:-1]):  # a match must have a token after it
        where.setdefault(token, []).append(i)

    def propose(draft: list[int], count: int) -> list[int]:
        context = prompt[-longest:] + draft
        for size in range(min(longest, len(context)), 0, -1):
            tail = context[-size:]
            for start in reversed(where.get(tail[0], ())):
                if start + size < len(prompt) and prompt[start: start + size] == tail:
                    return prompt[start + size: start + size + count]
        return []

    return propose


def token_margins(logits: torch.Tensor) -> torch.Tensor:
    """[m] per row of ``logits`` [m, vocab]: the probability of its likeliest token minus the
    runner-up's (1: sure; near 0: a toss-up; the doubt gate's ``top_margin``)."""
    top = logits.float().softmax(dim=-1).topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def check_tokens(tokens: object) -> None:
    """ValueError unless ``tokens`` is an integer in [1, MAX_DRAFT_TOKENS]."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_DRAFT_TOKENS:
        raise ValueError(f"draft tokens must be an integer in [1, {MAX_DRAFT_TOKENS}], got {tokens!r}")


def feed(model: ModelAdapter, caches: list[torch.Tensor], tokens: list[int], positions: torch.Tensor,
         tables: RopeTables) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor, torch.Tensor]]]:
    """One drafting pass (and decoding's verification of the draft, ``Prefilled.fed``): the rows of
    ``tokens`` at ``positions`` [m] (consecutive) over the rows before them in ``caches`` (per layer
    [2,Hkv,N',d], rotated K and V; ``tables``: RoPE of positions 0..N'-1), their K/V written there.
    Returns their logits [m, vocab] and, per layer, what a ``QuestionScore`` reads: (layer, q
    [1,H,m,d] rotated, keys [1,Hkv,N',d], a view of the cache, whose rows past a row's own position
    it never reads)."""
    rows = Rows.at(positions, tables)
    lo, hi = int(positions[0]), int(positions[-1]) + 1
    h = model.embed(torch.tensor([tokens], device=positions.device))  # [1, m, hidden]
    seen = []
    for layer, kv in enumerate(caches):
        cos, sin = rows.rope.layer(layer)  # [m, d]
        x = model.attn_input(layer, h)
        k, v = model.kv(layer, x)  # [1,Hkv,m,d], k before RoPE
        kv[0, :, lo:hi] = apply_rope(k[0], cos, sin)
        kv[1, :, lo:hi] = v[0]
        q = apply_rope(model.q(layer, x), cos, sin)  # [1,H,m,d]
        keys, values = kv[0][None], kv[1][None]
        seen.append((layer, q, keys))
        h = model.finish(layer, h, attend_rows(model, layer, q, keys, values, rows.plan))
    return model.logits(h[0]), seen


@dataclass(frozen=True)
class DraftSelector(QuestionSelector):
    """The question selector whose stage 1 is ``draft_stage``: the top of the score the ``tokens``
    draft rows (and with ``question`` the question's rows) pay, recomputed from layer 0; with
    ``gap`` (``selector="draft+gap"``), that score times each row's gap between its chunk's two
    records (``gap.py``; the score alone where the prompt has no gap, ``BlendInput.gap``)."""

    tokens: int = 8
    question: bool = False
    lookahead: int = LOOKAHEAD
    gap: bool = False

    @property
    def needs_gap(self) -> bool:
        return self.gap

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tokens(self.tokens)
        if isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int) or self.lookahead < 0:
            raise ValueError(f"draft lookahead must be an integer >= 0, got {self.lookahead!r}")

    def first_stage(self, model: ModelAdapter, inp: BlendInput) -> tuple[BlendOutput, DraftScore]:
        first, asked = draft_stage(model, inp, self.fusion, self.tokens, self.question, self.lookahead)
        asked.weight = inp.gap if self.gap else None
        return first, asked


@dataclass(frozen=True)
class LexicalDraftSelector(LexicalQuestionSelector):
    """``selector="lexical+draft+gap"``: ``lexical+question`` (Qwen's default) where the question
    names a chunk, the same blend bit for bit: that chunk recomputed whole. Where it names none (a
    multi-hop question naming two passages alike, the first of them read alone), ``draft``'s blend
    (``draft+gap``'s: ``draft`` is a ``DraftSelector`` with ``gap``) at the budget's lower bound:
    stage 1 drafts the answer, stage 2 recomputes from layer 0 the top of its score. On Qwen's
    prompts naming none, at the default's 8% it had 0.79-0.86x the question score's KL and no more
    answers (development MuSiQue F1 0.804 against 0.810), so it is an option; at 15% there it was
    better in both (docs/LEXICAL-DRAFT-GAP.md)."""

    draft: DraftSelector | None = None
    at_check_layers: ClassVar[bool] = False  # stage 2 is the draft's, from layer 0

    def __post_init__(self) -> None:
        if not isinstance(self.draft, DraftSelector):
            raise ValueError(f"the lexical+draft selector needs a DraftSelector, got {self.draft!r}")

    @property
    def needs_gap(self) -> bool:
        return self.draft.needs_gap

    def first_stage(self, model: ModelAdapter, inp: BlendInput) -> tuple[BlendOutput, DraftScore]:
        return self.draft.first_stage(model, inp)
