"""What a generation returns: the text and the blend statistics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class BlendStats:
    """Timings in seconds; token counts are prompt tokens unless named otherwise.

    reused_tokens: prompt tokens whose KV came from the cache and was not recomputed.
    recomputed_tokens: prompt tokens computed through the last layer (every uncached token plus
        the selected reused ones). reused + recomputed == prompt_tokens.
    hit_tokens: prompt tokens covered by chunk hits (before selection).
    head_tokens: the prompt's head, its tokens before its first chunk, whose exact K/V came from the
        head cache (computed once per head: ``blending/head.py``): part of reused_tokens, never
        computed past the first check layer. 0 for a full prefill, a prompt without chunks, or the
        first request of a head (computed for it: counted in recomputed_tokens).
    first_stage_tokens: rows a two-stage selector's first pass (``selector="question"``) computed
        through every layer before choosing what to recompute (0 for one-pass selectors).
    first_stage_s: the time of that first stage (its full-reuse pass and, with ``selector="draft"``,
        its drafting passes; part of prefill_s; 0.0 for one-pass selectors).
    draft_margin: with ``selector="draft"`` or ``"draft+gap"``, how sure full reuse was of the
        drafted answer's least sure token: its probability minus the runner-up's (the doubt gate's
        measure; None for other selectors). Low: full reuse's answer is in doubt.
    draft_verified: with a draft selector, the answer tokens after the first that one forward
        verifying the draft picked (``generation/lockstep.py``), each a decoding step saved but the
        forward itself; 0 where that forward did not run (the first token was not the draft's, a
        sampled or doubt-gated answer).
    recompute_ratio: the share of reused tokens recomputed that the blend used (with
        ``recompute_ratio="auto"`` the one it chose for this request, within the config's bounds).
    budget_signal: with the auto budget, the value of the signal that chose it (None otherwise;
        ``BlendConfig.auto_signal``, docs/ADAPTIVE-BUDGET.md).
    doubt_step: with the doubt gate (``BlendConfig.doubt_margin``), the answer step at which it
        prefilled the prompt again at ``doubt_ratio`` (None: it did not); the prompt counts above
        are then the second prefill's, the one the answer was decoded from.
    redone_tokens: what the first prefill recomputed before the doubt gate redid it (0 otherwise):
        the gate's extra compute.
    load_s: time spent reading chunk KV from the stores (part of ttft_s).
    ttft_s: from the call to the first generated token.
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0
    recomputed_tokens: int = 0
    hit_tokens: int = 0
    chunk_hits: int = 0
    chunk_misses: int = 0
    head_tokens: int = 0
    first_stage_tokens: int = 0
    completion_tokens: int = 0
    recompute_ratio: float = 1.0
    budget_signal: float | None = None
    doubt_step: int | None = None
    redone_tokens: int = 0
    load_s: float = 0.0
    first_stage_s: float = 0.0
    draft_margin: float | None = None
    draft_verified: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    total_s: float = 0.0
    finish_reason: str = "stop"

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Generation:
    text: str
    stats: BlendStats
    token_ids: list[int] = field(default_factory=list)
