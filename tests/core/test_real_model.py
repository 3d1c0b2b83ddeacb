"""Quality relations on the real bundled model (SmolLM2-135M-Instruct).

These are relations, not snapshots: KV-deviation selection at 15% must be closer to full prefill
than full reuse and than random selection at the same ratio, over several chunk orders; and on
fictional-fact lookups, blending must keep most of the answers full prefill gets right.
Measured values are in docs/TUNING.md and the README.
"""

import statistics

import pytest
import torch
from facts import FACTS, correct, passage, question

from cacheblend import BlendConfig
from cacheblend.tools.datasets import pydoc_passages
from cacheblend.tools.quality import answer_kl

pytestmark = pytest.mark.real_model

ANSWER = 16


@pytest.fixture(scope="module")
def pydoc_chunks(real_engine):
    passages = [p.text for p in pydoc_passages(real_engine.count_tokens, 384)]
    chosen = [t for t in passages if real_engine.count_tokens(t) >= 300][10:14]
    real_engine.warm(chosen)
    return chosen


def top1_agreement(reference, candidate, answer_ids) -> float:
    """Share of positions along the reference answer where both predict the same next token."""
    a = reference.continuation_logits(answer_ids).argmax(-1)
    b = candidate.continuation_logits(answer_ids).argmax(-1)
    return float((a == b).float().mean())


def test_deviation_selection_beats_full_reuse_and_random(real_engine, alone_engine, pydoc_chunks):
    """KV-deviation selection at 15% is closer to full prefill than random selection and than full
    reuse, in KL, with the default warming and with CacheBlend's (chunks warmed alone); with the
    latter also in top-1 agreement. (With the default warming, full reuse is so close already that
    top-1 agreement over these 48 answer tokens is within one token of the blend's.)"""
    configs = {
        "deviation": BlendConfig(selector="deviation"),
        "random": BlendConfig(selector="random"),
        "reuse": BlendConfig(ratios=(0.0,)),
    }
    alone_engine.warm(pydoc_chunks)
    for engine in (real_engine, alone_engine):
        kl = {name: [] for name in configs}
        agree = {name: [] for name in configs}
        for order in [(0, 1, 2, 3), (3, 1, 0, 2), (2, 3, 1, 0)]:
            req = dict(chunks=[pydoc_chunks[i] for i in order], query="Summarize what these passages explain.")
            full = engine.prefill(**req, recompute_ratio=1.0)
            answer = engine.generate_from(full, max_new_tokens=ANSWER).token_ids
            for name, cfg in configs.items():
                pre = engine.prefill(**req, config=cfg)  # the selection; the records read are the engine's
                assert pre.stats.chunk_hits == 4
                kl[name].append(answer_kl(full, pre, answer))
                agree[name].append(top1_agreement(full, pre, answer))
        mean_kl = {k: statistics.mean(v) for k, v in kl.items()}
        mean_agree = {k: statistics.mean(v) for k, v in agree.items()}
        assert mean_kl["deviation"] < mean_kl["reuse"], (engine.neighbours, mean_kl)
        assert mean_kl["deviation"] < mean_kl["random"], (engine.neighbours, mean_kl)
        if engine is alone_engine:
            assert mean_agree["deviation"] >= mean_agree["reuse"], mean_agree
            assert mean_agree["deviation"] >= mean_agree["random"], mean_agree


@pytest.fixture(scope="module")
def alone_engine(real_engine):
    """The bundled model with CacheBlend's own warming: every chunk computed alone."""
    from cacheblend import BlendEngine

    return BlendEngine(real_engine.adapter.model, real_engine.tokenizer, config=BlendConfig(neighbours=0))


def test_fact_lookups_keep_most_answers_full_prefill_gets_right(real_engine, alone_engine):
    """The default (15%, chunks warmed behind a neighbour, the first chunk's KV warmed alone) keeps
    more of the answers full prefill gets right than reordering the passages does (10 of 16), at
    least as many as CacheBlend (chunks warmed alone), and more than full reuse."""
    texts = [passage(i) for i in range(len(FACTS))]
    real_engine.warm(texts)
    alone_engine.warm(texts)
    n = len(FACTS)
    full_ok, kept = [], {"default": [], "alone": [], "alone reuse": []}
    for i in range(n):
        q, answers = question(i)
        req = dict(chunks=[texts[(i + k) % n] for k in (5, 11, 0, 17, 3, 8)], query=q,
                   prefix="Answer briefly from the passages.", max_new_tokens=24)
        full_ok.append(correct(real_engine.generate(**req, recompute_ratio=1.0).text, answers))
        if full_ok[-1]:
            kept["default"].append(correct(real_engine.generate(**req).text, answers))
            kept["alone"].append(correct(alone_engine.generate(**req).text, answers))
            kept["alone reuse"].append(correct(alone_engine.generate(**req, recompute_ratio=0.0).text, answers))
    assert sum(full_ok) >= n // 2, "the bundled model should answer most of these with full prefill"
    share = {k: statistics.mean(v) for k, v in kept.items()}
    # Measured (benchmarks/facts.py): 16 right with full prefill; kept 12 with the default
    # (neighbour-aware warming, the first chunk's KV warmed alone), 10 without lead records,
    # 8 with chunks alone, 6 with full reuse; reordering the passages under full prefill keeps 10.
    # See docs/TUNING.md. 0.65 = at least 11 of 16: more than a mere reordering keeps.
    assert share["default"] >= 0.65, share
    assert share["default"] >= share["alone"] > share["alone reuse"], share


def test_prompt_path_finds_chunks_in_a_foreign_template(real_engine, pydoc_chunks):
    a, b = pydoc_chunks[0], pydoc_chunks[1]
    prompt = real_engine.render_chat(
        [{"role": "system", "content": f"Use these documents:\n---\n{b}\n---\n{a}\n---"},
         {"role": "user", "content": "What are they about?"}]
    )
    out = real_engine.generate(prompt, max_new_tokens=8)
    s = out.stats
    assert (s.chunk_hits, s.chunk_misses) == (2, 0)
    n_chunk = real_engine.count_tokens(a) + real_engine.count_tokens(b)
    assert s.cached_tokens == n_chunk and s.reused_tokens >= 0.8 * n_chunk
    full = real_engine.generate(prompt, max_new_tokens=8, recompute_ratio=1.0)
    assert full.stats.reused_tokens == 0 and full.stats.prompt_tokens == s.prompt_tokens


def test_blended_ttft_is_lower_than_full_prefill_on_a_long_prompt(real_engine, pydoc_chunks):
    """Not a timing target (benchmarks hold those): a sanity relation with a wide margin."""
    req = dict(chunks=pydoc_chunks, query="What is this about?")
    real_engine.prefill(**req)  # warm-up
    full = min(real_engine.prefill(**req, recompute_ratio=1.0).stats.prefill_s for _ in range(2))
    blend = min(real_engine.prefill(**req).stats.prefill_s for _ in range(2))
    assert blend < full


def test_fp16_store_matches_fp32_store_closely(real_engine, alone_engine, pydoc_chunks):
    """The default fp16 KV on disk costs almost nothing in quality against fp32 KV (both warmed
    alone, so the same computation differs only in the stored dtype)."""
    from cacheblend import BlendEngine

    fp32 = BlendEngine(real_engine.adapter.model, real_engine.tokenizer, config=BlendConfig(kv_dtype="float32", neighbours=0))
    fp32.warm(pydoc_chunks[:2])
    alone_engine.warm(pydoc_chunks[:2])
    req = dict(chunks=pydoc_chunks[:2], query="What is this about?", recompute_ratio=0.0)
    a = alone_engine.prefill(**req).output.logits
    b = fp32.prefill(**req).output.logits
    kl = torch.nn.functional.kl_div(a.log_softmax(-1), b.log_softmax(-1), log_target=True, reduction="sum")
    assert float(kl) < 1e-3


def test_default_deviation_beats_query_attention_and_full_reuse_on_generated_facts(alone_engine):
    """At the same 15% budget on generated fact questions (dev split), with chunks warmed alone, the
    default selector (deviation) is closer to full prefill than query-attention selection, itself
    closer than full reuse. Measured on 30 dev questions: KL 0.179 / 0.230 / 0.331 (docs/TUNING.md)."""
    from cacheblend.tools.factset import questions

    real_engine = alone_engine
    qs = questions("dev", 6)
    real_engine.warm(sorted({p for q in qs for p in q.passages}))
    configs = {"default": BlendConfig(neighbours=0), "query": BlendConfig(selector="query"), "reuse": BlendConfig(ratios=(0.0,))}
    assert configs["default"].selector == "deviation"
    kl = {name: [] for name in configs}
    for q in qs:
        req = dict(chunks=q.passages, query=q.question, prefix="Answer briefly from the passages.")
        full = real_engine.prefill(**req, recompute_ratio=1.0)
        answer = real_engine.generate_from(full, max_new_tokens=ANSWER, stop=["."]).token_ids
        for name, cfg in configs.items():
            kl[name].append(answer_kl(full, real_engine.prefill(**req, config=cfg), answer))
    mean_kl = {k: statistics.mean(v) for k, v in kl.items()}
    assert mean_kl["default"] < mean_kl["query"] < mean_kl["reuse"], mean_kl
