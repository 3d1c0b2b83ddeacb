"""BlendConfig: the one validated, frozen knob surface of the blending engine.

Every number here was chosen by measurement on the bundled model; docs/TUNING.md has the
tables and the commands that made them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SELECTORS = ("deviation", "lexical", "lexical+question", "query", "query+deviation", "question", "question+deviation",
             "draft", "draft+gap", "lexical+draft+gap", "random", "chunk_start", "none", "all")
QUESTION_LAYERS = ("all", "last_third", "last")
QUESTION_HEADS = ("mean", "max")
MEASURES = ("k", "v", "kv")
CHUNK_CONTEXTS = ("none", "bos", "system")
KV_DTYPES = ("float16", "bfloat16", "float32", "int8", "int4")
MAX_NEIGHBOURS = 8
MAX_DRAFT_TOKENS = 64
# What keys the KV: fixed per engine (they are in every chunk's fingerprint and decide what warm
# stores). Every other field is a per-call blend knob that a prefill's ``config=`` may change.
KV_FIELDS = ("chunk_context", "neighbours", "lead_alone", "kv_dtype")
# What an adaptive budget (``recompute_ratio="auto"``) may read (blending.budget): at the check layer, or
# (``STAGE_SIGNALS``) after a draft selector's stage 1
BUDGET_SIGNALS = ("deviation", "concentration", "attention_other", "attention_entropy", "cached_share", "chunks",
                  "named_share", "draft_doubt")
SHARE_SIGNALS, STAGE_SIGNALS = ("named_share",), ("draft_doubt",)  # share: the budget is the signal, within the bounds


@dataclass(frozen=True)
class BlendConfig:
    """How the engine blends cached chunk KV into a prompt.

    Two kinds of fields: what keys the KV (``KV_FIELDS``: chunk_context, neighbours, lead_alone,
    kv_dtype), fixed when the engine is built because they decide what ``warm`` stores and are
    part of every chunk key; and the blend knobs (the rest), which a call's ``config=`` may
    change. A call's config that changes a ``KV_FIELDS`` value is refused, never ignored.

    Attributes:
        check_layers: layers at which reused tokens are re-ranked by KV deviation. Layers before the
            first check layer run a full prefill; several layers with shrinking ``ratios`` give the
            paper's "gradual filtering".
        ratios: fraction of reused tokens still recomputed after each check layer (non-increasing).
            The last entry is the recompute ratio: 1.0 reproduces full prefill, 0.0 is full reuse.
        selector: which tokens to recompute: ``deviation`` (CacheBlend: fresh vs cached KV),
            ``lexical`` (the chunks holding the question's rarer tokens, whole, best first, then
            deviation: ``blending.lexical.LexicalSelector``, docs/LEXICAL-SELECTOR.md),
            ``lexical+question`` (the same, but where the question names no chunk the question's
            attention over the model's depth picks, as ``question``'s does: ``LexicalQuestionSelector``),
            ``query`` (the tokens the question attends to most at the check layer),
            ``query+deviation`` (both, by weighted rank), ``random`` (ablation), ``chunk_start``
            (EPIC-style, the first tokens of each chunk), ``none`` or ``all``; ``question``
            (ProphetKV-style: a full-reuse pass over every layer scores each reused token by the
            attention the question's rows pay it, then the top share is recomputed from layer 0;
            only the last ratio counts: ``QuestionSelector``, docs/QUESTION-SELECTOR.md);
            ``question+deviation`` (that score and KV deviation by rank, at the check layers); ``draft``
            (``question``'s, scored by the rows of an answer drafted from full reuse: ``DraftSelector``),
            ``draft+gap`` (that score times each row's gap between its chunk's two records: ``gap.py``;
            the draft's alone where a chunk has one record: ``neighbours=0`` or ``lead_alone=False``),
            ``lexical+draft+gap`` (``lexical+question``, but ``draft+gap`` where the question names no chunk).
        measure: what the deviation selector compares, fresh vs cached: ``k``, ``v`` or ``kv``.
        chunk_context: what each chunk's KV is computed behind when it is warmed: ``none`` (the chunk
            starts at position 0), ``bos`` (the tokenizer's BOS token) or ``system`` (the chat
            template's system header). It is part of every chunk key.
        neighbours: how many similar passages each chunk is warmed behind (after the chunk context),
            0 for none (CacheBlend's own warming). Chunks computed behind a passage like them blend
            much closer to full prefill (``cacheblend.neighbours``; 1 was chosen on development facts, 2
            no better, 4 worse, confirmed on the reporting splits: docs/TUNING.md); warming costs about twice
            as long. In the fingerprint: never mixed with KV warmed alone; reused wherever the chunk lands.
        lead_alone: with ``neighbours`` > 0, each chunk's KV is also kept as computed behind the
            chunk context alone (a second record, the ``lead`` variant), and the prompt's first chunk
            reads that one: nothing but the prompt's head precedes it, so KV that has seen a
            neighbour would carry a passage the prompt does not hold. Later chunks read the KV
            warmed behind neighbours. At the same TTFT this cut the KL of the blend to full prefill
            by 39% on development facts, 10% on development pydoc (docs/TUNING.md); it costs a second
            record per chunk (twice the store bytes), ~8% of warm time (a chunk's alone KV comes free).
        kv_dtype: dtype of stored chunk KV. ``int8`` keeps fp16 in memory and writes int8 to disk and
            Redis (keys per channel before RoPE, values per token; about 0.51x the bytes of fp16);
            ``int4`` the same in 4 bits with groups of 32 (about 0.31x; see docs/STORES.md for its cost).
        seed: seed of the random selector.
        query_weight: weight of the query rank against the deviation rank in ``query+deviation``.
        sinks: the first ``sinks`` tokens of every chunk are recomputed before any other (EPIC's
            attention sinks), with ``deviation``, ``query`` and ``query+deviation``.
        fresh_check: keep the fresh K/V of every row at a check layer (computed anyway), not only the picked rows'.
        question_layers: which layers' question attention ``question`` and ``draft`` fuse: ``all``,
            ``last_third`` (the last ceil(L/3) layers) or ``last`` (the last layer alone).
        draft_tokens: how many greedy tokens the ``draft`` selectors draft and score (1-64).
        question_heads: ``mean`` or ``max`` over a layer's heads of the mass each head's question rows pay a token.
        question_per_chunk: divide each token's fused score by its chunk's total, so every chunk
            holds the same score mass (the budget then goes where attention is peaked within a
            chunk rather than to the chunks the question reads most).
        question_weight: weight of the question rank against the deviation rank in ``question+deviation``.
        lexical_share: the share of the budget the ``lexical`` selector gives the chunks the
            question names (whole, best first); the rest goes by deviation over every chunk.
        auto_budget: the adaptive recompute budget (``with_ratio("auto")``, ``recompute_ratio="auto"``
            on a prefill): at the check layer, before picking, ``blending.budget`` reads
            ``auto_signal`` for the request and recomputes ``auto_max_ratio`` of the reused tokens when
            it is at least ``auto_threshold``, ``auto_min_ratio`` otherwise (docs/ADAPTIVE-BUDGET.md).
            One check layer; not with ``question`` or ``draft`` (no check layer runs before their pick)
            but ``auto_signal="draft_doubt"``, which needs ``draft`` or ``draft+gap``: 1 minus how sure
            full reuse was of the draft's least sure token (``BlendStats.draft_margin``). ``ratios``
            are then unused (``with_ratio(r)`` goes back to them). The defaults (deviation, 5-30%, threshold
            0.00096: a mean of 15% on SmolLM2's development data, where it kept no more answers) are model-specific.
            ``auto_signal="named_share"`` (``selector="lexical..."``) recomputes the chunk the question names
            most, whole: the ratio is its share of the reused tokens, within the bounds (the least when none).
        doubt_margin: the doubt gate, a budget the answer decides (0: off). While an answer is
            decoded, when the likeliest next token's probability exceeds the second's by less than
            ``doubt_margin``, the prompt is prefilled again at ``doubt_ratio`` (once per request)
            and decoding goes on from that cache, the tokens already generated fed after it
            (docs/DOUBT-GATE.md; ``BlendStats.doubt_step`` and ``redone_tokens`` report a redo).
        doubt_ratio: the ratio of the doubt gate's second prefill (1.0: a full prefill; none at or above it).
        lead_after_named: with lead records and ``selector="lexical"``, how far the chunks after the
            one the question names move from their neighbour-warmed records toward their lead records:
            0 (False) not at all, 1 (True) all the way, 0.5 halfway (docs/LEXICAL-SELECTOR.md).
        lead_after_margin: ``lead_after_named`` only where the named chunk's score leads the next
            best's by at least this share of its own (0: always; a tie, as in multi-hop questions, is 0).
        spread: from the first check layer on, each reused row not recomputed moves by this share of the mean
            KV deviation (fresh - stored) of its chunk's recomputed rows (0: off; docs/DEVIATION-SPREAD.md).
    """

    check_layers: tuple[int, ...] = (1,)
    ratios: tuple[float, ...] = (0.15,)
    selector: str = "deviation"
    measure: str = "v"
    chunk_context: str = "system"
    neighbours: int = 1
    lead_alone: bool = True
    kv_dtype: str = "float16"
    seed: int = 0
    query_weight: float = 0.5
    sinks: int = 0
    fresh_check: bool = False
    question_layers: str = "all"
    question_heads: str = "mean"
    question_per_chunk: bool = False
    question_weight: float = 0.5
    draft_tokens: int = 8
    lexical_share: float = 1.0
    auto_budget: bool = False
    auto_signal: str = "deviation"
    auto_min_ratio: float = 0.05
    auto_max_ratio: float = 0.3
    auto_threshold: float = 0.00096  # SmolLM2's development fit (mean 14.6%); not Qwen's: docs/ADAPTIVE-BUDGET.md
    doubt_margin: float = 0.0
    doubt_ratio: float = 1.0
    lead_after_named: float = 0.0
    lead_after_margin: float = 0.0
    spread: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "check_layers", tuple(int(x) for x in self.check_layers))
        object.__setattr__(self, "ratios", tuple(float(x) for x in self.ratios))
        if not self.check_layers:
            raise ValueError("check_layers must name at least one layer")
        if len(self.check_layers) != len(self.ratios):
            raise ValueError(f"check_layers {self.check_layers} and ratios {self.ratios} must have the same length")
        if any(b <= a for a, b in zip(self.check_layers, self.check_layers[1:])) or min(self.check_layers) < 0:
            raise ValueError(f"check_layers must be non-negative and increasing, got {self.check_layers}")
        for r in self.ratios:
            _check_ratio(r)
        if any(b > a for a, b in zip(self.ratios, self.ratios[1:])):
            raise ValueError(f"ratios must not increase from one check layer to the next, got {self.ratios}")
        _check_choice("selector", self.selector, SELECTORS)
        for name in ("query_weight", "question_weight", "lexical_share", "spread", "lead_after_margin"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        for name in ("fresh_check", "lead_alone", "question_per_chunk", "auto_budget"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name, low, high in (("sinks", 0, None), ("draft_tokens", 1, MAX_DRAFT_TOKENS), ("neighbours", 0, MAX_NEIGHBOURS)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low or value > (high or value):
                raise ValueError(f"{name} must be an integer in [{low}, {'inf' if high is None else high}], got {value!r}")
        _check_choice("measure", self.measure, MEASURES)
        _check_choice("question_layers", self.question_layers, QUESTION_LAYERS)
        _check_choice("question_heads", self.question_heads, QUESTION_HEADS)
        _check_choice("chunk_context", self.chunk_context, CHUNK_CONTEXTS)
        _check_choice("kv_dtype", self.kv_dtype, KV_DTYPES)
        self._check_auto()
        for name, low_open in (("doubt_margin", False), ("doubt_ratio", True)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1 or (low_open and not value):
                raise ValueError(f"{name} must be a number in {'(0' if low_open else '[0'}, 1], got {value!r}")

    def _check_auto(self) -> None:
        _check_choice("auto_signal", self.auto_signal, BUDGET_SIGNALS)
        for name in ("auto_min_ratio", "auto_max_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if self.auto_min_ratio > self.auto_max_ratio:
            raise ValueError(f"auto_min_ratio {self.auto_min_ratio} is above auto_max_ratio {self.auto_max_ratio}")
        t = self.auto_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t:
            raise ValueError(f"auto_threshold must be a number, got {t!r}")
        if self.auto_budget and len(self.check_layers) != 1:
            raise ValueError(f"the auto budget takes one check layer, got {self.check_layers}")
        staged, drafts = self.auto_signal in STAGE_SIGNALS, self.selector in ("draft", "draft+gap")
        if self.auto_budget and (staged != drafts or self.selector == "question"):
            raise ValueError(f"auto_signal {self.auto_signal!r} does not fit selector {self.selector!r}: "
                             "'draft_doubt' reads a draft (selector 'draft' or 'draft+gap'), the others a check layer")
        w, gated = self.lead_after_named, self.lead_after_margin > 0
        lexical = self.selector.startswith("lexical") and self.neighbours > 0 and self.lead_alone
        if not isinstance(w, (int, float)) or not 0 <= w <= 1 or (w and not lexical) or (gated and not w):
            raise ValueError(f"lead_after_named must be in [0, 1] (True: 1), above 0 only with selector='lexical' "
                             f"(or 'lexical+question') and lead records; a lead_after_margin needs it above 0; got {w!r}")
        object.__setattr__(self, "lead_after_named", float(w))

    @property
    def recompute_ratio(self) -> float:
        """The fraction of reused tokens recomputed through the last layers. With ``auto_budget`` the least
        the policy may pick (``auto_min_ratio``); the blend reports its pick (``BlendStats.recompute_ratio``)."""
        return self.auto_min_ratio if self.auto_budget else self.ratios[-1]

    def auto(self) -> AutoRatio | None:
        """The auto budget's policy, None for a fixed ratio."""
        return AutoRatio(self.auto_signal, float(self.auto_min_ratio), float(self.auto_max_ratio),
                         float(self.auto_threshold)) if self.auto_budget else None

    def schedule(self) -> dict[int, float | AutoRatio]:
        """Check layer -> ratio (an ``AutoRatio`` with ``auto_budget``: the blend picks it per
        request). An all-zero schedule is full reuse from layer 0 (no prelude)."""
        if self.selector == "none" or (not self.auto_budget and not any(self.ratios)) or \
                (self.auto_budget and self.auto_max_ratio == 0):
            return {0: 0.0}
        if self.auto_budget:
            return {self.check_layers[0]: self.auto()}
        return dict(zip(self.check_layers, self.ratios))

    @classmethod
    def for_model(cls, model: str, **fields) -> BlendConfig:
        """The config ``model`` starts from: for a catalogue alias, the fields its reporting splits chose
        (``models/catalog.py``, ``CatalogModel.blend``), else the package default; ``fields`` override either
        (``for_model("qwen2.5-0.5b-instruct", neighbours=0)``) but for those given as None (a flag left
        out). A ``selector`` other than the model's drops the model's adaptive budget (its ``auto_``
        fields, tuned to its own selector): it runs at the fixed ratio unless ``fields`` set one."""
        from .models.catalog import MODELS

        chosen = dict(MODELS[model].blend) if model in MODELS else {}
        given = {k: v for k, v in fields.items() if v is not None}
        if given.get("selector", chosen.get("selector")) != chosen.get("selector", cls.selector):
            chosen = {k: v for k, v in chosen.items() if not k.startswith("auto_")}
        return cls(**(chosen | given))

    def check_model_layers(self, num_layers: int) -> None:
        """ValueError when a check layer is past the last layer of a ``num_layers``-layer model."""
        if max(self.check_layers) >= num_layers:
            raise ValueError(f"check layer {max(self.check_layers)} does not exist; the model has {num_layers} layers")

    def kv_differences(self, other: BlendConfig) -> dict[str, tuple[object, object]]:
        """The ``KV_FIELDS`` whose values differ from ``other``'s: field -> (ours, theirs)."""
        return {f: (getattr(self, f), getattr(other, f)) for f in KV_FIELDS if getattr(self, f) != getattr(other, f)}

    def with_kv_of(self, other: BlendConfig) -> BlendConfig:
        """This config's blend knobs with ``other``'s ``KV_FIELDS``: what a prefill on an engine
        configured with ``other`` can take (``engine.prefill(config=cfg.with_kv_of(engine.config))``)."""
        return replace(self, **{f: getattr(other, f) for f in KV_FIELDS})

    def with_ratio(self, ratio: float | str) -> BlendConfig:
        """This config with its final recompute ratio set to ``ratio``, or ``"auto"``: the adaptive
        budget (``auto_budget``, within ``auto_min_ratio``..``auto_max_ratio``).

        A gradual schedule keeps its shape: every ratio is scaled by ``ratio / ratios[-1]``
        (capped at 1). From a schedule ending in 0, the earlier ratios are kept at least ``ratio``.
        """
        if ratio == "auto":
            return replace(self, auto_budget=True)
        _check_ratio(ratio)
        last = self.ratios[-1]
        ratios = tuple(min(1.0, r * ratio / last) if last > 0 else max(r, ratio) for r in self.ratios)
        return replace(self, ratios=ratios[:-1] + (ratio,), auto_budget=False)


@dataclass(frozen=True)
class AutoRatio:
    """A schedule entry the blend resolves per request (``blending.budget``): at the check layer (or
    after a draft: ``STAGE_SIGNALS``) it reads ``signal``, keeps ``max_ratio`` of the reused tokens
    when the value is at least ``threshold``, ``min_ratio`` otherwise; a ``SHARE_SIGNALS`` value is
    the ratio itself, within [min_ratio, max_ratio]."""

    signal: str
    min_ratio: float
    max_ratio: float
    threshold: float

    def ratio(self, value: float) -> float:
        if self.signal in SHARE_SIGNALS:  # the ratio itself, within the bounds
            return min(self.max_ratio, max(self.min_ratio, value))
        return self.max_ratio if value >= self.threshold else self.min_ratio


def _check_ratio(ratio: float) -> None:
    if isinstance(ratio, str) or not isinstance(ratio, (int, float)) or not 0.0 <= float(ratio) <= 1.0 or ratio != ratio:
        raise ValueError(f"a recompute ratio must be a number in [0, 1] or \"auto\", got {ratio!r}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
