"""The question's score read with the answer's own first rows: a drafted answer in stage 1.

    .venv/bin/python benchmarks/draft_score.py --dataset facts --split dev --count 40 --threads 1 --methods "nb1 reuse,nb1 deviation,nb1 question last3,nb1 draft 4 last3,nb1 draft 8 last3,nb1 draft-only 8 last3" --run-file draft.json
    .venv/bin/python benchmarks/draft_score.py --model qwen2.5-0.5b-instruct --dataset ../shared/data/musique_s.json --split dev --count 25 --threads 2 --answer-tokens 24 --pool corpus --methods "nb1 reuse,nb1 lexical+question 8%,nb1 lexical+draft-only 8 8%" --run-file draft_qwen.json
    .venv/bin/python benchmarks/draft_score.py --quick     # 1 dev fact question, the draft of 4 tokens

The question selector (docs/QUESTION-SELECTOR.md) recomputes the reused tokens the question's rows
attend to most over the model's depth, read in a full-reuse first stage. Its misses are answers
that read elsewhere than the question did: the question names an organisation, the value token
("founded in 18..") reads a passage the question never looked at. So stage 1 here drafts the answer
first: greedy tokens from full reuse of the same records (each one a further full-reuse pass, the
uncached rows only), then one pass over the prompt and the draft whose question *and draft* rows
are scored (``draft-only``: the draft rows alone), fused as the question selector fuses (``last3``:
the last third of the layers, its best setting). Stage 2 is the question selector's (or, for
``lexical+draft``, Qwen's default's: the named chunk whole where the question names one, else the
fused score's top), over stage 1's caches of the prompt's rows.

The draft is full reuse's own answer, right or wrong; where it is wrong the hope is that recomputing
what its wrong value read changes that value. The draft does not stop at an end-of-answer token:
the rows after it are scored too. Cost: stage 1 runs once per draft token more than the question
selector's (``BlendStats.first_stage_tokens`` counts every row of every pass). Every other argument
is select_eval.py's: the tables, run files and the full-prefill reference are its.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import torch

import select_eval
from cacheblend.blending.blend import BlendOutput, reuse_pass
from cacheblend.blending.check import Check
from cacheblend.blending.inputs import BlendInput
from cacheblend.blending.lexical import LexicalQuestionSelector
from cacheblend.blending.question import Fusion, QuestionScore
from cacheblend.blending.selection import NoneSelector, QuestionSelector
from cacheblend.blending.selectors import make_selector
from cacheblend.config import BlendConfig
from cacheblend.models.adapter import ModelAdapter


def extended(inp: BlendInput, draft: list[int]) -> BlendInput:
    """``inp`` with the ``draft`` tokens appended as uncached rows (no record, offset 0)."""
    k = len(draft)
    ids = torch.cat([inp.ids, torch.tensor(draft, dtype=inp.ids.dtype, device=inp.ids.device)])
    reused = torch.cat([inp.reused, inp.reused.new_zeros(k)])
    offsets = torch.cat([inp.chunk_offsets, inp.chunk_offsets.new_zeros(k)])
    cached = inp.cached
    if cached is not None:
        pad = cached.new_zeros((*cached.shape[:3], k, cached.shape[4]))
        cached = torch.cat([cached, pad], dim=3)
    return replace(inp, ids=ids, reused=reused, cached=cached, chunk_offsets=offsets)


def draft_stage(model: ModelAdapter, inp: BlendInput, fusion: Fusion, tokens: int,
                only: bool) -> tuple[BlendOutput, QuestionScore]:
    """Stage 1 with a drafted answer (``blend._first_stage``'s hook): ``tokens`` greedy tokens from
    full reuse, then the full-reuse pass over the prompt and the draft, scoring the question and
    draft rows (``only``: the draft rows) at ``fusion``'s layers. Returns that pass's output cut to
    the prompt's N rows (a causal pass computes them as the prompt's own pass does), whose
    ``recomputed`` counts the rows of every pass, and the score cut to N (its ``draft``: the tokens)."""
    n = inp.ids.shape[0]
    out, draft, rows = reuse_pass(model, inp), [], 0
    for _ in range(tokens):
        rows += out.recomputed
        draft.append(int(out.logits.argmax()))
        if len(draft) < tokens:
            out = reuse_pass(model, extended(inp, draft))
    ext = extended(inp, draft)
    asking = Check.of(ext, NoneSelector()).asking
    if only:
        asking[:n] = False
    asked = QuestionScore(model, asking, fusion)
    out = reuse_pass(model, ext, asked)
    asked.per_layer = [p[:n] for p in asked.per_layer]
    asked.draft = draft  # what was drafted, for a reader
    out.kv = [(k[:, :, :n].contiguous(), v[:, :, :n].contiguous()) for k, v in out.kv]
    out.recomputed += rows
    return out, asked


@dataclass(frozen=True)
class Drafting:
    """A two-stage selector's stage 1 made ``draft_stage`` (of ``tokens``, the draft rows alone with ``only``)."""

    tokens: int = 4
    only: bool = False

    def first_stage(self, model: ModelAdapter, inp: BlendInput) -> tuple[BlendOutput, QuestionScore]:
        return draft_stage(model, inp, self.fusion, self.tokens, self.only)


@dataclass(frozen=True)
class DraftQuestionSelector(Drafting, QuestionSelector):
    """The question selector whose stage 1 is ``draft_stage``."""


@dataclass(frozen=True)
class LexicalDraftSelector(Drafting, LexicalQuestionSelector):
    """``lexical+question`` whose stage 1 (where the question names no chunk) is ``draft_stage``."""


def register() -> None:
    """Adds ``"nb1 draft T last3"``, ``"nb1 draft-only T last3"`` (the question selector at 15%) and
    ``"nb1 lexical+draft T 8%"``, ``"nb1 lexical+draft-only T 8%"`` (Qwen's default, ``nb1 lexical+question 8%``,
    with that stage 1) for T in 1, 2, 4, 8."""
    question = BlendConfig(selector="question", neighbours=1, question_layers="last_third")
    lexical = select_eval.METHODS["nb1 lexical+question 8%"][0]
    base = make_selector(lexical)
    for tokens in (1, 2, 4, 8):
        for word, only in (("draft", False), ("draft-only", True)):
            select_eval.METHODS[f"nb1 {word} {tokens} last3"] = (
                question, DraftQuestionSelector(layers="last_third", tokens=tokens, only=only))
            select_eval.METHODS[f"nb1 lexical+{word} {tokens} 8%"] = (
                lexical, LexicalDraftSelector(base.lexical, base.fusion, tokens=tokens, only=only))


def main(argv: list[str] | None = None) -> None:
    register()
    select_eval.main_with(__doc__, "nb1 reuse,nb1 question last3,nb1 draft 4 last3",
                          sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
