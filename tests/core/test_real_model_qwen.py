"""Quality relations on the second real model, Qwen2.5-Coder-0.5B-Instruct (24 layers, chat).

The same 24 fictional-fact lookups as the bundled model's tests (``facts.lookups``: ~750-token
prompts, the question's passage third of six), on a fresh engine over Qwen's weights with the
default warming (each chunk behind its nearest neighbour, lead records), its pool warmed in one
call; its blend is Qwen's catalogue choice (``BlendConfig.for_model``). Every blend is compared
with full reuse of the same records (ratio 0 through the same engine: exactly the KV the blend
reads), in KL along the full-prefill answer and in answers kept.
"""

import statistics

import pytest
from facts import FACTS, ORDER, lookups

from cacheblend import BlendConfig, BlendEngine, shared_engine

pytestmark = pytest.mark.real_model

QWEN = "qwen2.5-0.5b-instruct"


def test_qwen_default_the_named_chunk_and_deviation_beat_full_reuse_of_the_same_records(qwen_dir):
    """Qwen's default (its catalogue choice, ``BlendConfig.for_model``: ``selector="lexical+question"``,
    ``auto_signal="named_share"``, the passage the question names recomputed whole; every lookup
    here names its passage, so the question's attention never picks) and the package
    default (deviation, 15%) are closer to Qwen's full prefill than full reuse of the same records
    in KL, Qwen's default more so, and neither loses an answer full reuse keeps.

    Measured (fresh engine, pool = the 24 passages, fp32: deterministic): full prefill right 24 of
    24; kept named chunk 23, deviation 23, full reuse 23; the same answer as full prefill 21 / 22 /
    22; mean KL 0.0143 / 0.0172 / 0.0211 (named 0.68x of full reuse and 0.83x of deviation;
    deviation 0.82x). These short lookups are easy for the 0.5B model: every setting loses the
    same one answer, so here answers kept can only tie, and the relation in answers is the
    benchmarks' (reporting facts, docs/LEXICAL-SELECTOR.md: 39 of 47 kept by the named chunk, 31 by
    deviation, 29 by full reuse of the same records; too slow for CI on Qwen). The KL bounds fail a
    blend that removes less than 20% (deviation: 10%) of full reuse's KL. About 3 min on 2 idle
    cores (`-s` prints the numbers)."""
    weights = shared_engine(QWEN)
    config = BlendConfig.for_model(QWEN)
    assert config.selector == "lexical+question" and config.auto_signal == "named_share"
    engine = BlendEngine(weights.adapter.model, weights.tokenizer, config=config, name=weights.name)
    settings = {
        "default": (ORDER, {}),
        "deviation": (ORDER, {"config": BlendConfig().with_kv_of(engine.config)}),
        "reuse": (ORDER, {"recompute_ratio": 0.0}),
    }
    kl, kept, same, full_ok = lookups(engine, settings)
    mean = {k: statistics.mean(v) for k, v in kl.items()}
    print(f"full prefill right {full_ok}/{len(FACTS)}; kept {kept}; same answer {same}; mean KL {mean}")
    assert full_ok >= 20, "Qwen 0.5B answers nearly all of these with full prefill"
    assert mean["default"] < 0.8 * mean["reuse"], mean
    assert mean["deviation"] < 0.9 * mean["reuse"], mean
    assert mean["default"] < mean["deviation"], mean
    assert kept["default"] >= kept["reuse"] and kept["deviation"] >= kept["reuse"], kept
