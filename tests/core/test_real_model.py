"""Quality relations on the real bundled model (SmolLM2-135M-Instruct).

These are relations, not snapshots, and each compares the blend with references a blend must
beat: full reuse of the same records (ratio 0 through the same engine, so it reads exactly the
KV the blend reads), random selection at the same ratio, and, on fictional-fact lookups, a full
prefill of the same passages in another order (how far the model's answers move under a mere
reordering). Margins come from measurements written beside each assertion.

Every test builds its own engines over the shared weights (``fresh_real_engine``) and warms its
whole pool in one call, so the neighbours each chunk is warmed behind, and hence its KV, are
the same whether the test runs alone (``-k``) or in the suite.
"""

import statistics

import pytest
import torch
from facts import FACTS, ORDER, REORDERED, lookups

from cacheblend.blending.blend import budget_for
from cacheblend.generation.decode import continuation_logits_many
from cacheblend.tools.datasets import pydoc_passages
from cacheblend.tools.quality import answer_kls, mean_kl

pytestmark = pytest.mark.real_model

ANSWER = 16

# Mean KL(full || deviation 15%) over the three orders below must be under this share of full
# reuse's (same records), per warming (neighbours). Measured (fresh engines, these 4 chunks as
# the pool; per order deviation / reuse): neighbours=1: 0.0125/0.0185, 0.0586/0.0597,
# 0.0129/0.0206, mean 0.85 (two more orders: 0.79, 0.73); neighbours=0: 0.046/0.189, 0.093/0.196,
# 0.195/0.480, mean 0.39. The bounds leave room for numerical noise above the measured means and
# fail any blend that removes less than 7% (resp. 45%) of full reuse's KL. Measured by the test
# itself: `.venv/bin/python -m pytest -q -s tests/core/test_real_model.py -k deviation_selection`.
DEVIATION_VS_REUSE = {1: 0.93, 0: 0.55}


@pytest.fixture(scope="module")
def pydoc_chunks(real_engine):
    """Four pydoc passages of 300-384 tokens: the pool the pydoc tests warm (nothing else)."""
    passages = [p.text for p in pydoc_passages(real_engine.count_tokens, 384)]
    return [t for t in passages if real_engine.count_tokens(t) >= 300][10:14]


def top1_agreement(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """Share of positions along the reference answer where both predict the same next token, from
    their teacher-forced logits [T+1, vocab]."""
    return float((reference.argmax(-1) == candidate.argmax(-1)).float().mean())


def test_deviation_selection_beats_full_reuse_and_random(fresh_real_engine, pydoc_chunks):
    """KV-deviation selection at 15% is closer to full prefill than random selection and than full
    reuse of the same records, in KL, with the default warming and with CacheBlend's (chunks
    warmed alone); with the latter also in top-1 agreement. (With the default warming, full reuse
    is so close already that top-1 agreement over these 48 answer tokens is within one token of
    the blend's.)"""
    from cacheblend import BlendConfig

    configs = {
        "deviation": BlendConfig(selector="deviation"),
        "random": BlendConfig(selector="random"),
        "reuse": BlendConfig(ratios=(0.0,)),
    }  # the selection only: the records read are the engine's
    for neighbours in (1, 0):
        engine = fresh_real_engine(neighbours=neighbours)
        engine.warm(pydoc_chunks)
        kl = {name: [] for name in configs}
        agree = {name: [] for name in configs}
        reqs = [dict(chunks=[pydoc_chunks[i] for i in order], query="Summarize what these passages explain.")
                for order in [(0, 1, 2, 3), (3, 1, 0, 2), (2, 3, 1, 0)]]
        fulls = [engine.prefill(**req, recompute_ratio=1.0) for req in reqs]
        answers = engine.generate_many(fulls, max_new_tokens=ANSWER)  # decoded together
        for req, full, answer in zip(reqs, fulls, (a.token_ids for a in answers)):
            pres = {name: engine.prefill(**req, config=cfg.with_kv_of(engine.config)) for name, cfg in configs.items()}
            assert all(pre.stats.chunk_hits == 4 for pre in pres.values())
            ref, *rest = continuation_logits_many([full, *pres.values()], answer)  # one batched pass
            p = torch.log_softmax(ref, -1)
            for name, logits in zip(pres, rest):
                kl[name].append(mean_kl(p, torch.log_softmax(logits, -1)))
                agree[name].append(top1_agreement(ref, logits))
        mean = {k: statistics.mean(v) for k, v in kl.items()}
        mean_agree = {k: statistics.mean(v) for k, v in agree.items()}
        print(f"neighbours={neighbours} mean KL {mean} top-1 {mean_agree}")
        assert mean["deviation"] < DEVIATION_VS_REUSE[neighbours] * mean["reuse"], (neighbours, mean)
        assert mean["deviation"] < mean["random"], (neighbours, mean)
        if neighbours == 0:
            assert mean_agree["deviation"] >= mean_agree["reuse"], mean_agree
            assert mean_agree["deviation"] >= mean_agree["random"], mean_agree


@pytest.fixture(scope="module")
def fact_lookups(fresh_real_engine):
    """The 24 fictional-fact lookups on one engine with the default warming (behind a neighbour, the
    first chunk's KV alone), warmed once, full prefill's answers computed once: every setting the
    tests below compare, over the same records."""
    from cacheblend import BlendConfig

    engine = fresh_real_engine()
    return lookups(engine, {
        "blend": (ORDER, {}),
        "reuse": (ORDER, {"recompute_ratio": 0.0}),
        "reordered": (REORDERED, {"recompute_ratio": 1.0}),
        "lexical": (ORDER, {"config": BlendConfig(selector="lexical").with_kv_of(engine.config)}),
        "draft": (ORDER, {"config": BlendConfig(selector="draft", question_layers="last_third").with_kv_of(engine.config)}),
        "draft+gap": (ORDER, {"config": BlendConfig(selector="draft+gap", question_layers="last_third").with_kv_of(engine.config)}),
    })


def test_fact_lookups_blend_stays_closer_to_full_prefill_than_full_reuse_and_a_reordering(fact_lookups):
    """On 24 fictional-fact lookups (~750-token prompts, chunks warmed the default way: behind a
    neighbour, the first chunk's KV alone), the default blend is closer to full prefill than full
    reuse of the same records and than the same passages merely reordered, in KL along the
    full-prefill answer and in answers kept."""
    kl, kept, _, full_ok = fact_lookups
    mean = {k: statistics.mean(v) for k, v in kl.items()}
    print(f"full prefill right {full_ok}/{len(FACTS)}; kept {kept}; mean KL {mean}")
    assert full_ok >= len(FACTS) // 2, "the bundled model should answer most of these with full prefill"
    # Measured (fresh engine, pool = the 24 passages): full prefill right 16 of 24; kept of those
    # 16: blend 12, full reuse 8, reordered 10; mean KL blend 0.0412, full reuse 0.0540 (0.76x),
    # reordered 0.0410 (blend 1.00x of it, full reuse 1.32x). Bootstrap over the 24 questions
    # (4,000 resamples) of how often each bound holds on a resampled set, i.e. how well it
    # generalises: (1) 99.7%, (2) 92%, (3) 76% and 74%, (4) 78%. A mere reordering moves this
    # model's answers as much as the blend does, so (3) and (4) are the thin ones; they still
    # fail full reuse, which moves them 1.32x as much and keeps 2 fewer. Commands: the test
    # prints its numbers (`-s -k fact_lookups`); the bootstrap ran over the per-question values.
    assert mean["blend"] < 0.85 * mean["reuse"], mean  # (1) recomputing 15% removes >= 15% of reuse's KL
    assert kept["blend"] >= kept["reuse"] + 2, kept  # (2) and keeps more answers (measured +4)
    assert mean["blend"] < 1.15 * mean["reordered"] < mean["reuse"], mean  # (3) no farther than a reordering
    assert kept["blend"] > kept["reordered"], kept  # (4) measured 12 vs 10


def test_prompt_path_finds_chunks_in_a_foreign_template(fresh_real_engine, pydoc_chunks):
    engine = fresh_real_engine()
    engine.warm(pydoc_chunks)
    a, b = pydoc_chunks[0], pydoc_chunks[1]
    prompt = engine.render_chat(
        [{"role": "system", "content": f"Use these documents:\n---\n{b}\n---\n{a}\n---"},
         {"role": "user", "content": "What are they about?"}]
    )
    assert engine.generate(prompt, max_new_tokens=8).stats.head_tokens == 0  # its head computed: the first
    out = engine.generate(prompt, max_new_tokens=8)
    s = out.stats
    assert (s.chunk_hits, s.chunk_misses) == (2, 0)
    n_chunk = engine.count_tokens(a) + engine.count_tokens(b)
    assert s.hit_tokens == n_chunk  # every chunk token found, none lost to the template around it
    # all but the 15% picked, and the template's head before the first chunk (read exactly: blending/head.py)
    assert s.reused_tokens == n_chunk - budget_for(engine.config.recompute_ratio, n_chunk) + s.head_tokens
    assert 0 < s.head_tokens < s.prompt_tokens - n_chunk
    full = engine.generate(prompt, max_new_tokens=8, recompute_ratio=1.0)
    assert full.stats.reused_tokens == 0 and full.stats.prompt_tokens == s.prompt_tokens


def test_blend_computes_only_the_selected_rows_past_the_check_layer(fresh_real_engine, pydoc_chunks):
    """What makes a blend's TTFT lower than a full prefill's (timings are benchmarks'): on a long
    prompt, every row is computed up to the check layer, and from there on only the uncached
    tokens but the prompt's head (its exact K/V are read: blending/head.py) plus the 15% of cached
    tokens the selector picks; a full prefill computes every row of every layer."""
    engine = fresh_real_engine()
    engine.warm(pydoc_chunks)
    req = dict(chunks=pydoc_chunks, query="What is this about?")
    engine.prefill(**req)  # the first request of its head computes it
    blend, full = engine.prefill(**req), engine.prefill(**req, recompute_ratio=1.0)
    s, n = blend.stats, blend.stats.prompt_tokens
    assert s.chunk_hits == 4 and s.hit_tokens > 0.9 * n  # a long prompt, almost all of it cached
    (check,) = engine.config.check_layers
    assert s.head_tokens > 0
    selected = (n - s.hit_tokens - s.head_tokens) + budget_for(engine.config.recompute_ratio, s.hit_tokens)
    rows = blend.output.active_per_layer
    assert rows[:check] == [n] * check and rows[check:] == [selected] * (len(rows) - check)
    assert s.recomputed_tokens == selected and s.reused_tokens == n - selected
    assert full.output.active_per_layer == [n] * len(rows) and full.stats.recomputed_tokens == n


def test_the_thread_count_changes_no_result(fresh_real_engine, pydoc_chunks):
    """`make test` runs each xdist worker on 1 or 2 torch threads depending on whether the other
    worker still runs (tests/conftest.py), so no result may depend on the count: records warmed, the
    default blend (draft+gap), deviation and a full prefill are bit-identical on 1 and 2 threads."""
    from cacheblend import BlendConfig
    from cacheblend.models import catalog

    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            engine = fresh_real_engine(**dict(catalog.MODELS[catalog.DEFAULT].blend))  # SmolLM2's default
            engine.warm(pydoc_chunks[:2])
            req = dict(chunks=pydoc_chunks[:2], query="What is this about?")
            runs.append([engine.prefill(**req).output.logits,
                         engine.prefill(**req, config=BlendConfig().with_kv_of(engine.config)).output.logits,
                         engine.prefill(**req, recompute_ratio=1.0).output.logits])
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*runs):
        assert torch.equal(one, two)


def test_fp16_store_matches_fp32_store_closely(fresh_real_engine, pydoc_chunks):
    """The default fp16 KV on disk costs almost nothing in quality against fp32 KV (both warmed
    alone, so the same computation differs only in the stored dtype)."""
    fp16, fp32 = fresh_real_engine(neighbours=0), fresh_real_engine(kv_dtype="float32", neighbours=0)
    for engine in (fp16, fp32):
        engine.warm(pydoc_chunks[:2])
    req = dict(chunks=pydoc_chunks[:2], query="What is this about?", recompute_ratio=0.0)
    a = fp16.prefill(**req).output.logits
    b = fp32.prefill(**req).output.logits
    kl = torch.nn.functional.kl_div(a.log_softmax(-1), b.log_softmax(-1), log_target=True, reduction="sum")
    assert float(kl) < 1e-3


def test_default_deviation_beats_query_attention_and_full_reuse_on_generated_facts(fresh_real_engine):
    """At the same 15% budget on generated fact questions (dev split), with chunks warmed alone, the
    default selector (deviation) is closer to full prefill than query-attention selection, itself
    closer than full reuse. Measured on 30 dev questions: KL 0.179 / 0.230 / 0.331 (docs/TUNING.md)."""
    from cacheblend import BlendConfig
    from cacheblend.tools.factset import questions

    real_engine = fresh_real_engine(neighbours=0)
    qs = questions("dev", 6)
    real_engine.warm(sorted({p for q in qs for p in q.passages}))
    configs = {"default": BlendConfig(neighbours=0), "query": BlendConfig(selector="query"), "reuse": BlendConfig(ratios=(0.0,))}
    assert configs["default"].selector == "deviation"
    kl = {name: [] for name in configs}
    reqs = [dict(chunks=q.passages, query=q.question, prefix="Answer briefly from the passages.") for q in qs]
    fulls = [real_engine.prefill(**req, recompute_ratio=1.0) for req in reqs]
    answers = real_engine.generate_many(fulls, max_new_tokens=ANSWER, stop=["."])  # decoded together
    for req, full, answer in zip(reqs, fulls, (a.token_ids for a in answers)):
        pres = [real_engine.prefill(**req, config=cfg.with_kv_of(real_engine.config)) for cfg in configs.values()]
        for name, value in zip(configs, answer_kls(full, pres, answer)):
            kl[name].append(value)
    mean = {k: statistics.mean(v) for k, v in kl.items()}
    assert mean["default"] < mean["query"] < mean["reuse"], mean


def test_lexical_selection_is_closer_to_full_prefill_than_full_reuse_of_the_same_records(fact_lookups):
    """On the 24 fictional-fact lookups, with the default warming, recomputing the passage the
    question names (``selector="lexical"``, 15%) is closer to full prefill than full reuse of the
    same records, in KL along the full-prefill answer, and keeps at least as many answers.

    Measured (fresh engine, pool = the 24 passages): full prefill right 16; kept lexical 9, full
    reuse 8, deviation 12; same answer as full prefill 4 / 5 / 7; mean KL 0.0448 / 0.0540 / 0.0412
    (lexical 0.83x of full reuse); answer F1 0.672 / 0.674 / 0.702. On this set and model
    deviation is the better selector, which is why it stays the default (docs/LEXICAL-SELECTOR.md:
    on Qwen 0.5B the order turns). The bound leaves room above the measured 0.83x and fails any
    selector that removes less than 10% of full reuse's KL. The test prints its numbers (`-s -k lexical`)."""
    kl, kept, _, _ = fact_lookups
    mean = {k: statistics.mean(v) for k, v in kl.items()}
    print(f"kept {kept}; mean KL {mean}")
    assert mean["lexical"] < 0.9 * mean["reuse"], mean
    assert kept["lexical"] >= kept["reuse"], kept


def test_draft_selection_is_closer_to_full_prefill_than_full_reuse_of_the_same_records(fact_lookups):
    """On the 24 fictional-fact lookups, with the default warming, recomputing the 15% that an
    answer drafted from full reuse attends to (``selector="draft"``, 8 tokens, the last third of the
    layers: blending/draft.py) is closer to full prefill than full reuse of the same records, in KL
    along the full-prefill answer and in answers kept.

    Measured (fresh engine, pool = the 24 passages; at ebbb24e): full prefill right 16; kept draft 10,
    full reuse 8, deviation 12; mean KL 0.0367 / 0.0540 / 0.0412 (the draft 0.68x of full reuse, 0.89x
    of deviation). Closer in KL and further in answers than deviation here, the pattern of the
    question's score on these lookups (docs/DRAFT-SCORE.md). The bounds fail full reuse itself and any
    selector that removes less than 20% of its KL. The test prints its numbers (`-s -k draft`)."""
    kl, kept, _, _ = fact_lookups
    mean = {k: statistics.mean(v) for k, v in kl.items()}
    print(f"kept {kept}; mean KL {mean}")
    assert mean["draft"] < 0.8 * mean["reuse"], mean
    assert kept["draft"] > kept["reuse"], kept


def test_draft_gap_selection_is_closer_to_full_prefill_than_full_reuse_and_keeps_the_drafts_answers(fact_lookups):
    """On the 24 fictional-fact lookups, with the default warming, the draft's score times each row's
    gap between its chunk's two records (``selector="draft+gap"``: blending/gap.py; SmolLM2's
    catalogue default since stop 61) is closer to full prefill than full reuse of the same records,
    in KL and in answers kept, and keeps at least the draft's answers.

    Measured (fresh engine, pool = the 24 passages; at ec6bc5e): full prefill right 16; kept draft+gap
    11, draft 10, full reuse 8; mean KL 0.0387 / 0.0367 / 0.0540 (draft+gap 0.72x of full reuse and
    1.06x of the draft: on these lookups one answer more at a little more KL, the pattern of MuSiQue's
    development prompts, docs/RECORD-GAP.md). The KL bound fails full reuse itself and any selector
    that removes less than 20% of its KL. The test prints its numbers (`-s -k draft_gap`)."""
    kl, kept, _, _ = fact_lookups
    mean = {k: statistics.mean(v) for k, v in kl.items()}
    print(f"kept {kept}; mean KL {mean}")
    assert mean["draft+gap"] < 0.8 * mean["reuse"], mean
    assert kept["draft+gap"] > kept["reuse"], kept
    assert kept["draft+gap"] >= kept["draft"], kept
