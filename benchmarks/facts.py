"""Fictional-fact lookups on the bundled model: accuracy and KL of blending vs full prefill.

    .venv/bin/python benchmarks/facts.py

24 questions (tests/core/facts.py), each over 6 passages of ~110 tokens (~750-token prompts),
the passage holding the fact third. Prints a markdown table: mean KL(full || blend) over the
full-prefill answer, answers containing the gold fact, and how many of the questions full
prefill answers correctly are still answered correctly. A second chunk order is run for full
prefill to show how much answers move under a mere reordering.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))

from facts import FACTS, correct, passage, question  # noqa: E402

from cacheblend import BlendConfig, BlendEngine, shared_engine  # noqa: E402
from cacheblend.tools.quality import answer_kl  # noqa: E402

ORDER = (5, 11, 0, 17, 3, 8)
OTHER_ORDER = (8, 3, 17, 0, 11, 5)
PREFIX = "Answer briefly from the passages."
ALONE = dict(neighbours=0)  # CacheBlend's warming: each chunk computed alone
SETTINGS = {
    "default (15%, 1 neighbour, first chunk's KV warmed alone)": BlendConfig(),
    "1 neighbour for every chunk (no lead record), 15%": BlendConfig(lead_alone=False),
    "neighbours 2, 15%": BlendConfig(neighbours=2),
    "default, full reuse": BlendConfig(ratios=(0.0,)),
    "default at 30%": BlendConfig(ratios=(0.3,)),
    "default at 50%": BlendConfig(ratios=(0.5,)),
    "default at 70%": BlendConfig(ratios=(0.7,)),
    "CacheBlend 15% (deviation, chunks alone)": BlendConfig(**ALONE),
    "CacheBlend 30% (chunks alone)": BlendConfig(ratios=(0.3,), **ALONE),
    "deviation 15%, check layer 2 (alone)": BlendConfig(check_layers=(2,), **ALONE),
    "random 15% (alone)": BlendConfig(selector="random", **ALONE),
    "EPIC chunk start 15% (alone)": BlendConfig(selector="chunk_start", **ALONE),
    "full reuse (alone)": BlendConfig(ratios=(0.0,), **ALONE),
    "context=none, 15% (alone)": BlendConfig(chunk_context="none", **ALONE),
    "context=bos, 15% (alone)": BlendConfig(chunk_context="bos", **ALONE),
}


def warming(cfg: BlendConfig) -> tuple[str, int, bool]:
    """What a setting's chunk KV depends on: the engines that warm it differ only in this."""
    return cfg.chunk_context, cfg.neighbours, cfg.lead_alone and cfg.neighbours > 0


def main() -> None:
    base = BlendEngine(shared_engine().adapter.model, shared_engine().tokenizer, config=BlendConfig(**ALONE))
    texts = [passage(i) for i in range(len(FACTS))]
    engines: dict[tuple[str, int], BlendEngine] = {}
    for cfg in SETTINGS.values():
        if warming(cfg) not in engines:
            engines[warming(cfg)] = BlendEngine(base.adapter.model, base.tokenizer, config=cfg)
            engines[warming(cfg)].warm(texts, progress=False)
    n = len(FACTS)
    kls = {name: [] for name in SETTINGS}
    right = {name: [] for name in SETTINGS}
    full_right, reorder_right = [], []
    for i in range(n):
        q, answers = question(i)
        req = dict(chunks=[texts[(i + k) % n] for k in ORDER], query=q, prefix=PREFIX)
        full = base.prefill(**req, recompute_ratio=1.0)
        reference = base.generate_from(full, max_new_tokens=24)
        full_right.append(correct(reference.text, answers))
        other = dict(req, chunks=[texts[(i + k) % n] for k in OTHER_ORDER])
        reorder_right.append(correct(base.generate(**other, recompute_ratio=1.0, max_new_tokens=24).text, answers))
        for name, cfg in SETTINGS.items():
            pre = engines[warming(cfg)].prefill(**req, config=cfg)
            kls[name].append(answer_kl(full, pre, reference.token_ids))
            right[name].append(correct(base.generate_from(pre, max_new_tokens=24).text, answers))
    k = sum(full_right)
    print("| setting | mean KL vs full | correct (of 24) | kept (of the %d full prefill gets right) |" % k)
    print("|---|---|---|---|")
    print(f"| full prefill | 0 | {k} | {k} |")
    kept = sum(a and b for a, b in zip(full_right, reorder_right))
    print(f"| full prefill, passages reordered | - | {sum(reorder_right)} | {kept} |")
    for name in SETTINGS:
        kept = sum(a and b for a, b in zip(full_right, right[name]))
        print(f"| {name} | {statistics.mean(kls[name]):.4f} | {sum(right[name])} | {kept} |")


if __name__ == "__main__":
    main()
