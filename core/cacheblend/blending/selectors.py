"""The selector a ``BlendConfig`` names (``config.selector``): one table, in one place.

A new selector is a class with ``__call__(Candidates, budget) -> indices`` (``selection.py`` for
the one-pass ones, its own module when it is a concept of its own, as ``lexical.py``), a name in
``config.SELECTORS`` and an entry here.
"""

from __future__ import annotations

from ..config import BlendConfig
from .draft import DraftSelector, LexicalDraftSelector
from .lexical import LexicalQuestionSelector, LexicalSelector
from .question import Fusion
from .selection import (
    AllSelector,
    ChunkStartSelector,
    CombinedSelector,
    DeviationSelector,
    NoneSelector,
    QuerySelector,
    QuestionDeviationSelector,
    QuestionSelector,
    RandomSelector,
    Selector,
    SinkSelector,
)


def make_selector(config: BlendConfig) -> Selector:
    """The selector named by ``config.selector`` (with ``config.sinks`` on the scoring ones)."""
    scoring = {
        "deviation": lambda: DeviationSelector(config.measure),
        "query": lambda: QuerySelector(),
        "lexical": lambda: LexicalSelector(config.measure, config.lexical_share),
        "query+deviation": lambda: CombinedSelector(config.query_weight, config.measure),
        "question": lambda: QuestionSelector(config.question_layers, config.question_heads, config.question_per_chunk),
        "draft": lambda: DraftSelector(config.question_layers, config.question_heads, config.question_per_chunk,
                                       tokens=config.draft_tokens),
        "draft+gap": lambda: DraftSelector(config.question_layers, config.question_heads, config.question_per_chunk,
                                           tokens=config.draft_tokens, gap=True),
        "question+deviation": lambda: QuestionDeviationSelector(
            config.question_weight, config.measure, config.question_layers, config.question_heads, config.question_per_chunk
        ),
    }
    if config.selector in scoring:
        inner = scoring[config.selector]()
        return SinkSelector(inner, config.sinks) if config.sinks else inner
    if config.selector.startswith("lexical+"):  # the named chunk, else a two-stage score
        fusion = Fusion(config.question_layers, config.question_heads, config.question_per_chunk)
        lexical = LexicalSelector(config.measure, config.lexical_share)
        if config.selector == "lexical+question":
            return LexicalQuestionSelector(lexical, fusion)
        return LexicalDraftSelector(lexical, fusion, draft=scoring["draft+gap"]())
    if config.selector == "random":
        return RandomSelector(config.seed)
    if config.selector == "chunk_start":
        return ChunkStartSelector()
    if config.selector == "none":
        return NoneSelector()
    return AllSelector()
