"""Quality relations on the second real model, Qwen2.5-Coder-0.5B-Instruct (24 layers, chat).

The same 24 fictional-fact lookups as the bundled model's tests (``facts.lookups``: ~750-token
prompts, the question's passage third of six), on a fresh engine over Qwen's weights with the
default warming (each chunk behind its nearest neighbour, lead records), its pool warmed in one
call. Every blend is compared with full reuse of the same records (ratio 0 through the same
engine: exactly the KV the blend reads), in KL along the full-prefill answer and in answers kept.
"""

import statistics

import pytest
from facts import FACTS, ORDER, lookups

from cacheblend import BlendConfig, BlendEngine, shared_engine

pytestmark = pytest.mark.real_model

QWEN = "qwen2.5-0.5b-instruct"


def test_qwen_fact_lookups_default_and_named_chunk_beat_full_reuse_of_the_same_records(qwen_dir):
    """The default blend (deviation, 15%) and the named chunk's budget (``selector="lexical"``,
    ``auto_signal="named_share"``: the passage the question names, recomputed whole) are closer to
    Qwen's full prefill than full reuse of the same records in KL, the named chunk more so, and
    neither loses an answer full reuse keeps.

    Measured (fresh engine, pool = the 24 passages, fp32: deterministic): full prefill right 24 of
    24; kept blend 23, full reuse 23, named chunk 23; the same answer as full prefill 22 / 22 / 21;
    mean KL 0.0172 / 0.0211 / 0.0143 (blend 0.82x of full reuse, named 0.68x, 0.83x of the blend).
    These short lookups are easy for the 0.5B model: every setting loses the same one answer, so
    here answers kept can only tie, and the relation in answers is the benchmarks' (reporting
    facts, docs/LEXICAL-SELECTOR.md: 39 of 47 kept by the named chunk, 31 by the default, 29 by
    full reuse of the same records; too slow for CI on Qwen). The KL bounds fail a blend that
    removes less than 10% (the named chunk: 20%) of full reuse's KL. About 8 min on one busy core
    (`-s` prints the numbers)."""
    weights = shared_engine(QWEN)
    engine = BlendEngine(weights.adapter.model, weights.tokenizer, config=BlendConfig(), name=weights.name)
    named = BlendConfig(selector="lexical", auto_budget=True, auto_signal="named_share",
                        auto_min_ratio=0.05, auto_max_ratio=0.3).with_kv_of(engine.config)
    settings = {
        "blend": (ORDER, {}),
        "reuse": (ORDER, {"recompute_ratio": 0.0}),
        "named": (ORDER, {"config": named}),
    }
    kl, kept, same, full_ok = lookups(engine, settings)
    mean = {k: statistics.mean(v) for k, v in kl.items()}
    print(f"full prefill right {full_ok}/{len(FACTS)}; kept {kept}; same answer {same}; mean KL {mean}")
    assert full_ok >= 20, "Qwen 0.5B answers nearly all of these with full prefill"
    assert mean["blend"] < 0.9 * mean["reuse"], mean
    assert mean["named"] < 0.8 * mean["reuse"], mean
    assert mean["named"] < mean["blend"], mean
    assert kept["blend"] >= kept["reuse"] and kept["named"] >= kept["reuse"], kept
