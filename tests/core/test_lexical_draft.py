"""``selector="lexical+draft+gap"``: the chunk the question names, whole, as ``lexical+question``
recomputes it; where the question names none, ``draft+gap``'s blend at the same budget.

On tiny random models, through the engine (which reads both records of every chunk, so the gap is
in play): a prompt naming a chunk gives ``lexical+question``'s prefill bit for bit, with no first
stage; a prompt naming none (the ink chunk first, read alone) gives ``draft+gap``'s prefill at the
auto budget's lower bound bit for bit, its draft included, where ``lexical+question`` recomputes
other rows (the question's score): so each path is the one the other selector would not take.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cacheblend import BlendConfig
from cacheblend.blending.draft import DraftSelector, LexicalDraftSelector
from cacheblend.blending.lexical import LexicalSelector
from cacheblend.blending.question import Fusion
from cacheblend.blending.selectors import make_selector

from test_equivalence import CHUNKS, QUESTION

FLOOR = 0.08
BOTH = dict(neighbours=1, selector="lexical+draft+gap", draft_tokens=3, question_layers="last_third",
            auto_budget=True, auto_signal="named_share", auto_min_ratio=FLOOR, auto_max_ratio=0.6)


def test_the_config_builds_it_from_the_question_and_draft_knobs():
    selector = make_selector(BlendConfig(**{**BOTH, "question_heads": "max", "draft_tokens": 5}))
    draft = DraftSelector("last_third", "max", tokens=5, gap=True)
    assert selector == LexicalDraftSelector(LexicalSelector("v"), Fusion("last_third", "max"), draft=draft)
    assert selector.needs_gap and not selector.at_check_layers
    with pytest.raises(ValueError, match="needs a DraftSelector"):
        LexicalDraftSelector(LexicalSelector("v"), Fusion("last_third"))


def _prefills(engine, order, other: dict):
    """The engine's prefill of CHUNKS in ``order`` and QUESTION with its own config and with ``other``'s fields."""
    chunks = [CHUNKS[i] for i in order]
    engine.prefill(chunks=chunks, query=QUESTION)  # computes the head: both prefills below read it
    ours = engine.prefill(chunks=chunks, query=QUESTION)
    theirs = engine.prefill(chunks=chunks, query=QUESTION, config=replace(engine.config, **other))
    return ours, theirs


def _same(a, b) -> bool:
    return torch.equal(a.output.logits, b.output.logits) and len(a.output.active_rows) == len(b.output.active_rows) \
        and all(torch.equal(x, y) for x, y in zip(a.output.active_rows, b.output.active_rows))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_prompt_naming_a_chunk_blends_as_lexical_question(make_engine, family):
    engine = make_engine(family, **BOTH)
    engine.warm(CHUNKS)
    ours, theirs = _prefills(engine, (1, 0, 2), dict(selector="lexical+question"))  # the ink chunk second: named
    assert _same(ours, theirs)
    assert ours.stats.first_stage_tokens == 0 and ours.output.draft == []
    assert ours.stats.recompute_ratio == theirs.stats.recompute_ratio > FLOOR  # the named chunk's share


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_prompt_naming_none_blends_as_draft_gap_at_the_lower_bound(make_engine, family):
    engine = make_engine(family, **BOTH)
    engine.warm(CHUNKS)
    order = (0, 1, 2)  # the ink chunk first, read alone: no chunk named
    ours, draft = _prefills(engine, order, dict(selector="draft+gap", auto_budget=False, ratios=(FLOOR,)))
    assert _same(ours, draft)
    assert ours.output.draft == draft.output.draft and len(ours.output.draft) == 3
    assert ours.stats.first_stage_tokens == draft.stats.first_stage_tokens > 0
    assert ours.stats.recompute_ratio == FLOOR and ours.stats.budget_signal == 0.0
    _, question = _prefills(engine, order, dict(selector="lexical+question"))
    assert ours.stats.recomputed_tokens == question.stats.recomputed_tokens  # the same budget ...
    assert not torch.equal(ours.output.active_rows[-1], question.output.active_rows[-1])  # ... other rows


def test_qwens_option_keeps_qwens_knobs_with_the_budget_it_is_given():
    """docs/LEXICAL-DRAFT-GAP.md's option for Qwen: its question layers kept, the budget as given
    (a selector other than the model's drops the model's budget fields: ``for_model``)."""
    cfg = BlendConfig.for_model("qwen2.5-0.5b-instruct", selector="lexical+draft+gap", auto_budget=True,
                                auto_signal="named_share", auto_min_ratio=0.15, auto_max_ratio=0.3)
    qwen = BlendConfig.for_model("qwen2.5-0.5b-instruct")
    assert cfg == replace(qwen, selector="lexical+draft+gap", auto_min_ratio=0.15)
    assert isinstance(make_selector(cfg), LexicalDraftSelector) and cfg.recompute_ratio == 0.15
