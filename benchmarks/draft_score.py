"""The question's score read with the answer's own first rows: a drafted answer in stage 1.

    .venv/bin/python benchmarks/draft_score.py --dataset facts --split dev --count 40 --threads 1 --methods "nb1 reuse,nb1 deviation,nb1 question last3,nb1 draft 4 last3,nb1 draft 8 last3,nb1 draft-only 8 last3" --run-file draft.json
    .venv/bin/python benchmarks/draft_score.py --model qwen2.5-0.5b-instruct --dataset ../shared/data/musique_s.json --split dev --count 25 --threads 2 --answer-tokens 24 --pool corpus --methods "nb1 reuse,nb1 lexical+question 8%,nb1 lexical+draft-only 8 8%" --run-file draft_qwen.json
    .venv/bin/python benchmarks/draft_score.py --quick     # 1 dev fact question, the drafts of 4 tokens

The question selector (docs/QUESTION-SELECTOR.md) recomputes the reused tokens the question's rows
attend to most over the model's depth, read in a full-reuse first stage. Its misses are answers
that read elsewhere than the question did: the question names an organisation, the value token
("founded in 18..") reads a passage the question never looked at. So stage 1 here drafts the answer
first: greedy tokens decoded over the full-reuse pass's cache, whose rows' attention (with
``draft``, the question's rows' too; ``draft-only``: the draft rows alone) is the score, fused as
the question selector fuses (``last3``: the last third of the layers, its best setting). That is
the product's ``draft`` selector (``BlendConfig(selector="draft", draft_tokens=T)``,
``cacheblend/blending/draft.py``): ``draft-only`` is that config, ``draft`` its ``DraftSelector``
with ``question=True``. Stage 2 is the question selector's (or, for ``lexical+draft``, Qwen's
default's: the named chunk whole where the question names one, else the fused score's top).

The draft is full reuse's own answer, right or wrong; where it is wrong the hope is that recomputing
what its wrong value read changes that value. The draft does not stop at an end-of-answer token.
Cost: T rows more than the question selector's stage 1 (``BlendStats.first_stage_tokens``), and the
rows of the guesses its drafting passes rejected (``draft.py``: each pass verifies prompt lookup's
guesses; ``one-by-one`` drafts a token per pass, the same draft). Until
stop 57 this script drafted by T more full-reuse passes over the prompt and the draft (the run files
of stop 56: the same tokens and scores, tests/core/test_draft.py, at 1.0-1.2x full prefill's time).
Every other argument is select_eval.py's: the tables, run files and the full-prefill reference are its.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import select_eval
from cacheblend.blending.blend import BlendOutput
from cacheblend.blending.draft import DraftScore, DraftSelector, draft_stage
from cacheblend.blending.inputs import BlendInput
from cacheblend.blending.lexical import LexicalQuestionSelector
from cacheblend.blending.selectors import make_selector
from cacheblend.config import BlendConfig
from cacheblend.models.adapter import ModelAdapter


@dataclass(frozen=True)
class LexicalDraftSelector(LexicalQuestionSelector):
    """``lexical+question`` whose stage 1 (where the question names no chunk) is ``draft_stage``
    (of ``tokens``; the question's rows scored too unless ``only``)."""

    tokens: int = 8
    only: bool = True

    def first_stage(self, model: ModelAdapter, inp: BlendInput) -> tuple[BlendOutput, DraftScore]:
        return draft_stage(model, inp, self.fusion, self.tokens, question=not self.only)


def register() -> None:
    """Adds ``"nb1 draft-only T last3"`` (``BlendConfig(selector="draft", draft_tokens=T)`` at 15%),
    ``"nb1 draft-only T last3 one-by-one"`` (the same drafted one token per pass: ``lookahead=0``),
    ``"nb1 draft T last3"`` (the question's rows scored too) and ``"nb1 lexical+draft T 8%"``,
    ``"nb1 lexical+draft-only T 8%"`` (Qwen's default, ``nb1 lexical+question 8%``, with that stage 1)
    for T in 1, 2, 4, 8."""
    lexical = select_eval.METHODS["nb1 lexical+question 8%"][0]
    base = make_selector(lexical)
    for tokens in (1, 2, 4, 8):
        drafting = BlendConfig(selector="draft", neighbours=1, question_layers="last_third", draft_tokens=tokens)
        select_eval.METHODS[f"nb1 draft-only {tokens} last3"] = (drafting, None)
        select_eval.METHODS[f"nb1 draft {tokens} last3"] = (drafting, DraftSelector("last_third", tokens=tokens,
                                                                                    question=True))
        select_eval.METHODS[f"nb1 draft-only {tokens} last3 one-by-one"] = (
            drafting, DraftSelector("last_third", tokens=tokens, lookahead=0))
        for word, only in (("draft", False), ("draft-only", True)):
            select_eval.METHODS[f"nb1 lexical+{word} {tokens} 8%"] = (
                lexical, LexicalDraftSelector(base.lexical, base.fusion, tokens=tokens, only=only))


def main(argv: list[str] | None = None) -> None:
    register()
    select_eval.main_with(__doc__, "nb1 reuse,nb1 question last3,nb1 draft 4 last3,nb1 draft-only 4 last3",
                          sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
