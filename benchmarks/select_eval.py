"""Selector experiments on the generated fact set (cacheblend.tools.factset): accuracy, agreement and KL.

    .venv/bin/python benchmarks/select_eval.py --split dev --count 120 --methods reuse,deviation,query
    .venv/bin/python benchmarks/select_eval.py --quick     # 1 dev fact question, reuse and deviation

One engine per warming setting (chunks alone, or behind their K most similar passages of the
split's pool: the ``nbK`` methods), each warmed once; per question one full prefill (the reference), then every method:
accuracy (greedy short answer contains the gold string), agreement (the same answer as full
prefill), mean KL(full || method) over the full-prefill answer's tokens, recomputed share, and
the median ratio of its prefill time to full prefill's (short prompts: a rough guide only). The run
file also keeps every question's row per method (``questions``: the measures, the blend's margins,
a draft's least sure token's margin (``BlendStats.draft_margin``) and its answer text), which
benchmarks/gate_eval.py reads and a reader can inspect answer by answer.

``--pool corpus`` (MuSiQue): the ``nbK`` engines pick neighbours among every passage of the
file's prompts (all 150 examples' six), not only the run's: a passage is then less often warmed
behind one of its own prompt's passages, as in a corpus where retrieval did not gather the pool.
Only the run's passages are warmed either way; the run file states the share of them whose
nearest neighbour shares a prompt with them (``meta.own_prompt_share``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from cacheblend import BlendConfig, BlendEngine, shared_engine
from cacheblend.stores import chunk_key
from cacheblend.tools.datasets import load_musique, pydoc_passages, pydoc_workload
from cacheblend.tools.factset import correct, questions
from cacheblend.tools.quality import mean_kl, token_f1
from runfile import DEFAULT_MODEL, RunRecord, add_common
from cacheblend.prefilling import Prefiller, named_in
from cacheblend.prompts.assemble import chunk_encodings
from cacheblend.blending.selectors import make_selector
from cacheblend.prompts.request import has_chat_template
from cacheblend.blending.selection import (
    ChunkStartSelector,
    CombinedSelector,
    DeviationSelector,
    QuerySelector,
    RandomSelector,
    SinkSelector,
)

PREFIX = "Answer briefly from the passages."
DEV = DeviationSelector("v")
STOP = [".", "\n"]


def ask(tokenizer, question: str) -> str:
    """The query text: the question itself for a chat model; for a base model (no chat template:
    Gemma 3 270M) the completion cue "Question: ...\nAnswer:", without which it answers with a newline."""
    return question if has_chat_template(tokenizer) else f"Question: {question}\nAnswer:"


C = BlendConfig(neighbours=0)  # the methods without a "nbK" prefix warm chunks alone
# name -> (config: schedule, ratio, fresh_check; selector: overrides config.selector when given)
METHODS = {
    "reuse": (BlendConfig(ratios=(0.0,), neighbours=0), None),
    "deviation": (C, None),
    "deviation 30%": (BlendConfig(ratios=(0.3,), neighbours=0), None),
    "random": (C, RandomSelector(0)),
    "chunk_start": (C, ChunkStartSelector()),
    "deviation+fresh": (BlendConfig(fresh_check=True, neighbours=0), None),
    "deviation+sinks2": (C, SinkSelector(DEV, 2)),
    "deviation+sinks4": (C, SinkSelector(DEV, 4)),
    "query mean": (C, QuerySelector("mean")),
    "query max": (C, QuerySelector("max")),
    "query mean L2": (BlendConfig(check_layers=(2,), neighbours=0), QuerySelector("mean")),
    "query mean L4": (BlendConfig(check_layers=(4,), neighbours=0), QuerySelector("mean")),
    "q+d 0.5": (C, CombinedSelector(0.5)),
    "q+d 0.3": (C, CombinedSelector(0.3)),
    "q+d 0.7": (C, CombinedSelector(0.7)),
    "q+d 0.5 max": (C, CombinedSelector(0.5, heads="max")),
    "deviation L2": (BlendConfig(check_layers=(2,), neighbours=0), None),
    "gradual 1+4": (BlendConfig(check_layers=(1, 4), ratios=(0.3, 0.15), neighbours=0), None),
    "gradual 1+4 q+d": (BlendConfig(check_layers=(1, 4), ratios=(0.3, 0.15), neighbours=0), CombinedSelector(0.5)),
    "deviation 5%": (BlendConfig(ratios=(0.05,), neighbours=0), None),
}
# neighbour-aware warming: chunks computed behind their K most similar passages of the pool
for _k in (1, 2, 4):
    METHODS[f"nb{_k} reuse"] = (BlendConfig(ratios=(0.0,), neighbours=_k), None)
    for _r in (5, 15, 30, 50, 70):
        _suffix = "" if _r == 15 else f" {_r}%"
        METHODS[f"nb{_k} deviation{_suffix}"] = (BlendConfig(ratios=(_r / 100,), neighbours=_k), None)
    METHODS[f"nb{_k} q+d 0.5"] = (BlendConfig(neighbours=_k), CombinedSelector(0.5))
    METHODS[f"nb{_k} chunk_start"] = (BlendConfig(neighbours=_k), ChunkStartSelector())
    for _layer in (2, 3):
        METHODS[f"nb{_k} deviation L{_layer}"] = (BlendConfig(check_layers=(_layer,), neighbours=_k), None)
    METHODS[f"nb{_k} gradual 1+2+4"] = (BlendConfig(check_layers=(1, 2, 4), ratios=(0.4, 0.25, 0.15), neighbours=_k), None)
    METHODS[f"nb{_k} deviation kv"] = (BlendConfig(measure="kv", neighbours=_k), None)


# the two-stage question selector (ProphetKV-style: a full-reuse pass scores each reused token by the
# question's attention over every layer, then the top share is recomputed from layer 0;
# docs/QUESTION-SELECTOR.md). Check layers play no part, only the ratio does.
_Q = dict(selector="question", neighbours=1)
METHODS["nb1 question"] = (BlendConfig(**_Q), None)
METHODS["nb1 question max"] = (BlendConfig(**_Q, question_heads="max"), None)
METHODS["nb1 question last3"] = (BlendConfig(**_Q, question_layers="last_third"), None)
METHODS["nb1 question last"] = (BlendConfig(**_Q, question_layers="last"), None)
METHODS["nb1 question chunk"] = (BlendConfig(**_Q, question_per_chunk=True), None)
METHODS["nb1 question max last3"] = (BlendConfig(**_Q, question_heads="max", question_layers="last_third"), None)
METHODS["nb1 question+sinks2"] = (BlendConfig(**_Q, sinks=2), None)
METHODS["nb1 question 30%"] = (BlendConfig(**_Q, ratios=(0.3,)), None)
# the last third at the named chunk's mean budget on long prompts (11-14% of the prompt, docs/QUESTION-SELECTOR.md)
for _r in (10, 12, 13):
    METHODS[f"nb1 question last3 {_r}%"] = (BlendConfig(**_Q, question_layers="last_third", ratios=(_r / 100,)), None)
# stage 1's score and the KV deviation at check layer 1 (after deviation's layer-0 prelude), by weighted rank
_QD = dict(selector="question+deviation", neighbours=1)
METHODS["nb1 question+deviation"] = (BlendConfig(**_QD), None)
METHODS["nb1 question+deviation last3"] = (BlendConfig(**_QD, question_layers="last_third"), None)
METHODS["nb1 question+deviation 0.3"] = (BlendConfig(**_QD, question_weight=0.3), None)

# "nbK" engines keep lead records (BlendConfig.lead_alone, the default): the prompt's first chunk
# reads its KV warmed alone. "nbK plain ..." reads the KV warmed behind neighbours for every chunk.
for _k in (1, 2):
    for _how in ("deviation", "reuse"):
        METHODS[f"nb{_k} plain {_how}"] = (replace(METHODS[f"nb{_k} {_how}"][0], lead_alone=False), None)
# position ladders: "ladder 0-1-2 deviation" = the prompt's first chunk uses its KV warmed alone,
# the second its KV warmed behind 1 neighbour, every later one behind 2
LADDERS: dict[str, tuple[int, ...]] = {}
for _ladder in ("0-1", "0-2", "0-1-2", "1-2"):
    for _how in ("deviation", "reuse"):
        _steps = tuple(int(x) for x in _ladder.split("-"))
        LADDERS[f"ladder {_ladder} {_how}"] = _steps
        METHODS[f"ladder {_ladder} {_how}"] = METHODS[f"nb{max(_steps)} {_how}"]
# context extrapolation: every chunk after the first reads lead + A * (warmed behind 1 neighbour -
# lead), A != 1 pushing its KV further from (A > 1) or back toward (A < 1) its KV warmed alone
MIXES = {f"nb1 mix {_a}": _a for _a in (0.5, 1.5, 2.0)}
for _name in MIXES:
    METHODS[_name] = METHODS["nb1 deviation"]
# which record a chunk reads, by where its nearest neighbour (the passage its record was warmed
# behind) is: "nb1 present ..." = every chunk after the first reads its record warmed behind its
# neighbour only if that neighbour is in the prompt, else its lead record (warmed alone); "nb1 before
# ..." = only if the neighbour precedes it in the prompt (the context full prefill gives it)
PRESENT: dict[str, bool] = {}
for _where in ("present", "before"):
    for _how in ("deviation", "reuse", "lexical named"):
        PRESENT[f"nb1 {_where} {_how}"] = _where == "before"
# sensitivity references, not blends: full prefill of the same passages in another order (how far
# a 135M model's answer moves when nothing but the passage order changes)
REORDERS = {
    "full reversed": lambda chunks: chunks[::-1],
    "full rotated": lambda chunks: chunks[1:] + chunks[:1],  # the first passage moved last
}
for _name in REORDERS:
    METHODS[_name] = (BlendConfig(ratios=(1.0,), neighbours=0), None)


class OracleSelector:
    """Not a product selector: it needs full prefill. Picks the reused tokens whose KV under full
    reuse differs most from full prefill's, summed over every layer (V): what the check-layer
    deviation tries to predict. If it is no better than ``deviation``, the selection is not what
    limits the blend at that budget."""

    needs_query = False

    def __init__(self) -> None:
        self.score: torch.Tensor | None = None  # [prompt tokens], set per prompt by run()

    def set_reference(self, full, reuse) -> None:
        self.score = sum((f[1][0].float() - r[1][0].float()).pow(2).sum((0, 2)) for f, r in zip(full.output.kv, reuse.output.kv))

    def __call__(self, cand, budget: int) -> torch.Tensor:
        scores = self.score[cand.positions.long()]
        return torch.topk(scores, max(0, min(budget, scores.numel())), sorted=False).indices


for _k in (0, 1):
    METHODS["oracle" if _k == 0 else f"nb{_k} oracle"] = (BlendConfig(neighbours=_k), OracleSelector())


# the lexical selector (blending/lexical.py): the chunks holding the question's rarer token ids
# recomputed whole, best first, then deviation (docs/LEXICAL-SELECTOR.md)
METHODS["lexical"] = (BlendConfig(selector="lexical", neighbours=0), None)
for _r in (5, 15, 20, 30):
    METHODS["nb1 lexical" + ("" if _r == 15 else f" {_r}%")] = (BlendConfig(selector="lexical", ratios=(_r / 100,)), None)
# the budget the question names: exactly the chunk it names most, whole (5% when it names none)
METHODS["nb1 lexical named"] = (BlendConfig(selector="lexical", auto_budget=True, auto_signal="named_share",
                                            auto_min_ratio=0.05, auto_max_ratio=0.3), None)
for _name in PRESENT:
    METHODS[_name] = METHODS[_name.replace(" present", "").replace(" before", "")]
for _cap in (10, 15, 20):  # the same, capped: a named chunk over the cap gets its top-deviation tokens only
    METHODS[f"nb1 lexical named max{_cap}"] = (replace(METHODS["nb1 lexical named"][0], auto_max_ratio=_cap / 100), None)
# the product's "the named chunk, else the question" (selector="lexical+question"): where the question
# names no chunk, the budget's lower bound (5 or 8%) by the question's stage-1 score, last third
for _low in (5, 8):
    METHODS[f"nb1 lexical+question {_low}%"] = (replace(METHODS["nb1 lexical named"][0], selector="lexical+question",
                                                        question_layers="last_third", auto_min_ratio=_low / 100), None)
# the same, but where the prompt's first chunk reads its lead record, the question's score leaves it out
for _low in (5, 8):
    _cfg = METHODS[f"nb1 lexical+question {_low}%"][0]
    METHODS[f"nb1 lexical+question {_low}% skip first"] = (_cfg, replace(make_selector(_cfg), skip_first=True))
for _share in (0.25, 0.5, 0.75):  # the named chunks get this share of the budget, deviation the rest
    METHODS[f"nb1 lexical share {_share}"] = (BlendConfig(selector="lexical", lexical_share=_share), None)


# "<method> <knob> <value>": that method's config with one more blend knob (its selector kept)
KNOBS = {
    "doubt": "doubt_margin",  # the doubt gate at margin t: where the answer is unsure, a full prefill takes over (docs/DOUBT-GATE.md)
    "spread": "spread",  # each stale row moves by A x its chunk's recomputed rows' mean deviation (docs/DEVIATION-SPREAD.md)
    "lead": "lead_after_named",  # the chunks after the named one move this far toward their lead records
    "margin": "lead_after_margin",  # ... only where the named chunk leads the next by this share (docs/LEXICAL-SELECTOR.md)
}


def knob_method(name: str) -> bool:
    """Registers "<method> <knob> <value>" (``KNOBS``: "<method> doubt <t>", "<method> spread <A>", ...)
    when <method> is known or is itself one (``"nb1 lexical+question 8% lead 0.5 margin 0.4"``)."""
    for word, field in KNOBS.items():
        base, sep, value = name.rpartition(f" {word} ")
        if " " in value:  # another knob follows this one: the last knob is the outermost
            continue
        if sep and (base in METHODS or knob_method(base)) and (word == "spread" or METHODS[base][1] is None):
            config, selector = METHODS[base]
            METHODS[name] = (replace(config, **{field: float(value)}), selector)
            return True
    return False


def examples(dataset: str, split: str, count: int, engine, start: int = 0, target: str = "any") -> list:
    """Question/passages/answers examples of ``dataset`` for ``split`` (dev or report only), from
    the split's ``start``-th example on. ``target="first"`` (facts only): the passage holding the
    answer is moved to the front, the others keep their order (the prompt's first chunk reads its
    lead record: how much recomputing it is worth)."""
    if dataset == "facts":
        qs = questions(split, start + count)[start:]
        return [_target_first(q) for q in qs] if target == "first" else qs
    if target != "any":
        raise SystemExit("--target first needs --dataset facts (the passage holding the answer is known there)")
    if dataset == "pydoc":  # seed 1 is the development split, seed 0 the reporting split
        passages = pydoc_passages(engine.count_tokens, min_tokens=384)
        return pydoc_workload(passages, start + count, 6, seed=1 if split == "dev" else 0)[start:]
    data = load_musique(dataset, 6)  # examples 0-49 are the development split, 50-149 reporting
    return (data[:50] if split == "dev" else data[50:150])[start : start + count]


def asks_of(engine, q) -> bool:
    """Whether the question of example ``q`` names a chunk as Qwen's default reads it
    (``prefilling.named_in``, what ``lead_after_named`` reads its records by; the first chunk, read
    alone, names none): ``--asks``."""
    req = engine.request(chunks=q.passages, query=ask(engine.tokenizer, q.question), prefix=PREFIX)
    chunks = [list(c.ids) for c in chunk_encodings(req.text, engine.kv.encode)]
    return named_in(req, chunks, engine.kv.encode) is not None


def _target_first(q):
    rest = [p for i, p in enumerate(q.passages) if i != q.target]
    return replace(q, passages=[q.passages[q.target], *rest], target=0)


def corpus(dataset: str) -> list[str]:
    """Every passage of a MuSiQue file's prompts (``--pool corpus``), both splits."""
    if dataset in ("facts", "pydoc"):
        raise SystemExit("--pool corpus needs a MuSiQue-format dataset")
    return sorted({p for ex in load_musique(dataset, 6) for p in ex.passages})


def own_prompt_share(engine: BlendEngine, qs: list, pool: list[str]) -> float:
    """The share of the run's passages (``pool``) whose nearest neighbour in ``engine``'s index is a
    passage of a prompt holding them: how much of the neighbour warming's help retrieval's own pool gives."""
    together: dict[str, set[str]] = {p: set() for p in pool}
    for q in qs:
        for p in q.passages:
            together[p].update(q.passages)
    near = engine.kv.warmer.nearest(engine.kv.warmer.prepare(pool))
    return sum(bool(near[p]) and near[p][0] in together[p] for p in pool) / len(pool)


def run(dataset: str, split: str, count: int, names: list[str], answer_tokens: int, log=print, start: int = 0,
        model: str = DEFAULT_MODEL, pool_of: str = "run", meta: dict | None = None, target: str = "any",
        asks: str = "any") -> dict[str, dict]:
    shared = shared_engine(model)
    model, tok = shared.adapter.model, shared.tokenizer
    room = 8 << 30  # every chunk of a large pool stays in memory (MuSiQue's 30 prompts hold ~2.2 GB of fp16 KV)
    engine = BlendEngine(model, tok, config=C, memory_bytes=room)  # chunks alone
    qs = examples(dataset, split, count, engine, start, target)
    everything = sorted({p for q in qs for p in q.passages})  # the neighbours' pool whatever --asks keeps
    if asks != "any":  # only the prompts whose question names a chunk (or none): their split positions in meta
        picked = [i for i, q in enumerate(qs) if asks_of(engine, q) == (asks == "chunk")]
        qs = [qs[i] for i in picked]
        if not qs:
            raise SystemExit(f"--asks {asks}: none of the {count} prompts from {start} on")
        if meta is not None:
            meta.update(asks=asks, examples=[start + i for i in picked])
    pool = sorted({p for q in qs for p in q.passages})
    engines = {0: engine}
    needed = {METHODS[n][0].neighbours for n in names} | {k for n in names for k in LADDERS.get(n, ())}
    for k in sorted(needed - {0}):
        engines[k] = BlendEngine(model, tok, config=BlendConfig(neighbours=k), memory_bytes=room)
    known = corpus(dataset) if pool_of == "corpus" else everything
    for k in engines.keys() - {0}:  # the neighbour index holds the pool (or the corpus) before the warm picks from it
        engines[k].kv.warmer.learn([], known)
    if len(engines) > 1:  # every nbK engine's nearest neighbour is the same: measured once
        share = own_prompt_share(engines[min(engines.keys() - {0})], qs, pool)
        log(f"neighbours among {len(known)} passages: {share:.1%} of the run's are warmed behind their own prompt's")
        if meta is not None:
            meta.update(pool=pool_of, pool_passages=len(known), own_prompt_share=round(share, 4))
    # the engines whose records some method reads (a reorder is a full prefill: it reads none)
    reads = {k for n in names if n not in REORDERS for k in (METHODS[n][0].neighbours, *LADDERS.get(n, ()))}
    for k, eng in engines.items():
        if k not in reads:  # engine 0 only runs full prefill here: nothing to warm
            continue
        started = time.time()
        eng.warm(pool, progress=False)
        log(f"warmed {len(pool)} passages behind {k} neighbours in {time.time() - started:.0f} s", flush=True)
    ladders = {n: _ladder_records(LADDERS[n], engines) for n in names if n in LADDERS}  # records functions
    ladders.update({n: _mix_records(MIXES[n], engines[1]) for n in names if n in MIXES})
    if any(n in PRESENT for n in names):
        placed = _placed_records(engines[1], pool)
        ladders.update({n: placed(PRESENT[n]) for n in names if n in PRESENT})
    views = {}  # plain methods: an engine without lead records over the same stores
    for n in names:
        if METHODS[n][0].neighbours and not METHODS[n][0].lead_alone:
            views[n] = BlendEngine(model, tok, config=METHODS[n][0], memory_bytes=1 << 20)
            views[n].kv.stores = engines[METHODS[n][0].neighbours].kv.stores
    keys = ("right", "agree", "f1", "top1", "kl", "share", "time", "margin", "margin_min", "draft_margin", "answer")
    rows = {n: {k: [] for k in keys} for n in ["full prefill", *names]}
    started = time.time()
    for i, q in enumerate(qs):
        req = dict(chunks=q.passages, query=ask(tok, q.question), prefix=PREFIX)
        full = engine.prefill(**req, recompute_ratio=1.0)
        ref = engine.generate_from(full, max_new_tokens=answer_tokens, stop=STOP)
        p = torch.log_softmax(full.continuation_logits(ref.token_ids), dim=-1)  # [T+1, vocab]
        _record(rows["full prefill"], (_right(ref.text, q.answers), True, 1.0, 1.0, 0.0, 1.0, 1.0,
                                       *_margins(p, len(ref.token_ids)), None, ref.text.strip()))
        ends_eos = ref.stats.finish_reason == "stop" and p[-1].argmax().item() in engine.eos_ids
        for name in names:
            cfg, sel = METHODS[name]
            eng = views.get(name) or engines[cfg.neighbours]
            records = ladders.get(name) or eng.kv.records
            if isinstance(sel, OracleSelector):
                sel.set_reference(full, Prefiller(eng.adapter, eng.kv.encode, records, cfg.with_ratio(0.0)).run(
                    engine.request(**req)))
            asked = dict(req, chunks=REORDERS[name](q.passages)) if name in REORDERS else req
            if hasattr(sel, "prepare"):  # a selector that reads the prompt's records itself (record_gap.py)
                sel.prepare(eng, engine.request(**asked))
            pre = Prefiller(eng.adapter, eng.kv.encode, records, cfg, sel).run(engine.request(**asked))
            kl, top1, same, q_ref = _compare(p, pre, ref.token_ids, ends_eos, engine.eos_ids)
            spent = pre.stats.recomputed_tokens
            if pre.doubt is not None:  # the gate: its own answer, its own path along the reference
                gen = engine.generate_from(pre, max_new_tokens=answer_tokens, stop=STOP)
                kl, top1 = _gated(p, pre, q_ref, ref.token_ids)
                same = gen.text.strip() == ref.text.strip()
                spent = gen.stats.recomputed_tokens + gen.stats.redone_tokens
            if same:
                text, own = ref.text, _margins(q_ref, len(ref.token_ids))
            else:
                gen = engine.generate_from(pre, max_new_tokens=answer_tokens, stop=STOP)
                text = gen.text
                own = _margins(torch.log_softmax(pre.continuation_logits(gen.token_ids), -1), len(gen.token_ids))
            share = spent / pre.stats.prompt_tokens  # with the doubt gate: both prefills
            ratio = pre.stats.prefill_s / full.stats.prefill_s
            f1 = token_f1(text, ref.text)
            _record(rows[name], (_right(text, q.answers), text.strip() == ref.text.strip(), f1, top1, kl, share, ratio,
                                 *own, pre.stats.draft_margin, text.strip()))
        if (i + 1) % 10 == 0 and i + 1 < len(qs):  # partial tables: a long run can be cut short
            log(f"{table(summarize(rows), i + 1)}\n{time.time() - started:.0f} s\n", flush=True)
    return rows


def _ladder_records(steps: tuple[int, ...], engines: dict):
    """A records function whose i-th prompt chunk reads the KV warmed behind
    ``steps[min(i, len(steps) - 1)]`` neighbours (the plain records of that engine)."""

    def lookup(chunks):
        picks = [engines[steps[min(i, len(steps) - 1)]] for i in range(len(chunks))]
        return [e.kv.stores.get(chunk_key(e.kv.fingerprint, c)) for e, c in zip(picks, chunks)]

    return lookup


def _mix_records(alpha: float, warmed: BlendEngine):
    """A records function over ``warmed``'s records (1 neighbour, with lead records) whose chunks
    after the first read ``lead + alpha * (plain - lead)`` (``ChunkRecord.toward`` the lead record
    by 1 - alpha: beyond it for alpha > 1)."""

    def lookup(chunks):
        records = []
        for i, ids in enumerate(chunks):
            plain, lead = (warmed.kv.stores.get(k) for k in warmed.kv.record_keys(ids))
            records.append(lead if i == 0 else plain.toward(lead, 1 - alpha))
        return records

    return lookup


def _placed_records(warmed: BlendEngine, pool: list[str]):
    """Records functions over ``warmed``'s records (1 neighbour, with lead records): a chunk after
    the first reads its record warmed behind its nearest neighbour when that neighbour is in the
    prompt (anywhere, or with ``before`` ahead of it), its lead record (warmed alone) otherwise."""
    near = warmed.kv.warmer.nearest(warmed.kv.warmer.prepare(pool))
    text_of = {tuple(warmed.kv.encode(p).ids): p for p in pool}

    def records(before: bool):
        def lookup(chunks):
            texts = [text_of.get(tuple(c)) for c in chunks]
            out = []
            for i, ids in enumerate(chunks):
                plain, lead = warmed.kv.record_keys(ids)
                seen = texts[:i] if before else texts[:i] + texts[i + 1:]
                nb = near.get(texts[i]) or []
                out.append(warmed.kv.stores.get(plain if i and nb and nb[0] in seen else lead))
            return out

        return lookup

    return records


def _right(text: str, answers: list[str]) -> float | None:
    return float(correct(text, answers)) if answers else None


def _step_margins(logp: torch.Tensor) -> torch.Tensor:
    """[steps] the probability margin between the two likeliest tokens of each row of log-probs
    [steps, vocab] (what the doubt gate reads, ``doubt.top_margin``)."""
    top = logp.exp().topk(2, dim=-1).values  # [steps, 2]
    return top[:, 0] - top[:, 1]


def _margins(logp: torch.Tensor, count: int) -> tuple[float, float]:
    """The blend's confidence along its own greedy answer: ``logp`` [T+1, vocab] log-probs teacher-forced
    along that answer of ``count`` tokens. The margin at the first step (known before any token is
    sent) and its minimum over the answer's steps."""
    margin = _step_margins(logp[: max(1, count)])
    return float(margin[0]), float(margin.min())


def _gated(p: torch.Tensor, pre, q: torch.Tensor, ids: list[int]) -> tuple[float, float]:
    """KL(full || gated) and top-1 agreement along the reference answer ``ids`` with the doubt gate
    read on that path: the blend's log-probs ``q`` up to the first step whose margin is below the
    gate's, the redone prefill's from there."""
    low = (_step_margins(q[: len(ids) + 1]) < pre.doubt.margin).nonzero()
    if low.numel():
        k = int(low[0])
        q = torch.cat([q[:k], torch.log_softmax(pre.redone(k).continuation_logits(ids), dim=-1)[k:]])
    greedy = q.argmax(-1).tolist()
    return mean_kl(p, q), sum(a == b for a, b in zip(greedy, ids)) / max(1, len(ids))


def _compare(p: torch.Tensor, pre, ids: list[int], ends_eos: bool, eos_ids) -> tuple[float, float, bool, torch.Tensor]:
    """KL(full || pre) over the reference answer ``ids`` (``p``: full prefill's log-probs along
    it), the share of answer tokens its argmax agrees with, and whether greedy decoding from ``pre`` would produce the same answer (its argmax at
    every teacher-forced step is the reference token, then EOS where the reference ended so):
    if so, there is no need to decode again. Last, ``pre``'s log-probs along ``ids`` [T+1, vocab]."""
    q = torch.log_softmax(pre.continuation_logits(ids), dim=-1)  # [T+1, vocab]
    kl = mean_kl(p, q)
    greedy = q.argmax(-1).tolist()
    top1 = sum(a == b for a, b in zip(greedy, ids)) / max(1, len(ids))
    same = greedy[: len(ids)] == list(ids) and (not ends_eos or greedy[-1] in eos_ids)
    return kl, top1, same, q


def _record(row: dict, values: tuple) -> None:
    for key, value in zip(row, values):
        row[key].append(value)


def summarize(rows: dict[str, dict]) -> dict[str, dict]:
    """Per method: the mean of every measure over the questions (the median for prefill time),
    with ``kept`` (answers full prefill gets right that the method also gets right; None without
    gold answers)."""
    full = rows["full prefill"]["right"]
    out = {}
    for name, r in rows.items():
        means = {k: (statistics.median(v) if k == "time" else statistics.mean(v)) if v and v[0] is not None else None
                 for k, v in r.items() if k != "answer"}  # the answers' texts stay per question
        kept = sum(bool(a and b) for a, b in zip(full, r["right"])) if full and full[0] is not None else None
        out[name] = {**means, "kept": kept}
    return out


def merge(parts: list[tuple[int, dict]]) -> dict[str, dict]:
    """One summary from the (question count, summary) of runs over disjoint questions, for the
    methods every run has: means weighted by the question counts, ``kept`` summed (None where a
    run has none). Prefill time is a median per run; the merge weights those medians like the
    means (a rough guide, as in each run)."""
    total = sum(n for n, _ in parts)
    out = {}
    for name in [m for m in parts[0][1] if all(m in s for _, s in parts)]:
        rs = [(n, s[name]) for n, s in parts]
        keys = [k for k in rs[0][1] if k != "kept" and all(k in r for _, r in rs)]  # an older run may lack some
        out[name] = {k: None if None in (r[k] for _, r in rs) else sum(n * r[k] for n, r in rs) / total for k in keys}
        kept = [r.get("kept") for _, r in rs]
        out[name]["kept"] = None if None in kept else sum(kept)
    return out


def table(summary: dict[str, dict], count: int) -> str:
    full = summary["full prefill"]
    graded = full["kept"] is not None
    head = "| method | accuracy | kept (of %s) | same answer | answer F1 vs full | top-1 agreement | mean KL | recomputed | prefill time vs full |" % (full["kept"] if graded else 0)
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary.items():
        acc = f"{r['right']:.3f}" if graded else "-"
        kept = r["kept"] if graded else "-"
        lines.append(
            f"| {name} | {acc} | {kept} | {r['agree']:.3f} | {r['f1']:.3f} "
            f"| {r['top1']:.3f} | {r['kl']:.4f} | {r['share']:.1%} | {r['time']:.2f} |"
        )
    return "\n".join(lines) + f"\n\n{count} questions"


def main_with(doc: str, quick_methods: str, argv: list[str]) -> None:
    """The command of a script that adds methods of its own (key_temperature.py, named_after.py):
    ``doc`` is what --help describes, and --quick runs one development fact question with
    ``quick_methods`` (this module's own --quick fixes the methods)."""
    global __doc__
    __doc__ = doc
    if "--quick" in argv:
        argv = [a for a in argv if a != "--quick"]
        argv += ["--dataset", "facts", "--split", "dev", "--count", "1", "--answer-tokens", "8", "--methods", quick_methods]
    main(argv)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="1 development fact question, methods reuse and deviation, 8 answer tokens")
    ap.add_argument("--dataset", default="facts", help="facts, pydoc, or a MuSiQue-format JSON path")
    ap.add_argument("--split", default="dev", choices=("dev", "report"))
    ap.add_argument("--count", type=int, default=120)
    ap.add_argument("--start", type=int, default=0, help="skip the split's first START examples")
    ap.add_argument("--methods", default="reuse,deviation,random,chunk_start")
    ap.add_argument("--answer-tokens", type=int, default=20)
    ap.add_argument("--pool", default="run", choices=("run", "corpus"),
                    help="where the nbK engines find neighbours: the run's passages, or every passage of the MuSiQue file")
    ap.add_argument("--target", default="any", choices=("any", "first"),
                    help="facts: where the passage holding the answer is (first: moved to the front)")
    ap.add_argument("--asks", default="any", choices=("any", "chunk", "none"),
                    help="only the prompts whose question names a chunk (chunk) or names none (none), as Qwen's "
                         "default reads it (lexical.named_before_blend): a method that differs from another on one "
                         "kind only is run on those. The neighbours are still found among every prompt's passages "
                         "(or the corpus), so each chunk reads the records it reads in the unfiltered run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 suits shared CPUs)")
    ap.add_argument("--json", dest="run_file", default=None,
                    help="the same as --run-file: the per-method means with the run's metadata (benchmarks/frontier.py plots them)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="run nothing: print one table from --json files of runs over disjoint questions of one "
                         "dataset, of one split or both (and write it to --json)")
    args = ap.parse_args(argv)
    if args.quick:
        args.dataset, args.split, args.count, args.start = "facts", "dev", 1, 0
        args.methods, args.answer_tokens = "reuse,deviation", 8
    record = RunRecord.start(args)
    if args.merge:
        runs = [json.loads(Path(p).read_text()) for p in args.merge]
        if len({r["meta"]["dataset"] for r in runs}) != 1:
            raise SystemExit("the runs to merge must be of one dataset")
        splits = "+".join(sorted({r["meta"]["split"] for r in runs}))  # MuSiQue's "dev+report": all 150
        models = {r.get("run", {}).get("model", DEFAULT_MODEL) for r in runs}  # runs before run files: the bundled model
        if len(models) != 1:
            raise SystemExit(f"the runs to merge must be of one model, not {sorted(models)}")
        record.model = models.pop()
        merged, count = merge([(r["meta"]["count"], r["methods"]) for r in runs]), sum(r["meta"]["count"] for r in runs)
        print(table(merged, count))
        meta = dict(runs[0]["meta"], split=splits, start=min(r["meta"].get("start", 0) for r in runs), count=count,
                    merged=args.merge)
        out = {"meta": meta, "methods": merged}
        if all("questions" in r for r in runs):  # every question's row, in the runs' order, for the methods all have
            out["questions"] = {m: {k: [x for r in runs for x in r["questions"][m][k]] for k in runs[0]["questions"][m]}
                                for m in merged}
        record.write(args.run_file, out)
        return
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    names = args.methods.split(",")
    unknown = [n for n in names if n not in METHODS and not knob_method(n)]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    started = time.time()
    pooled: dict = {}
    rows = run(args.dataset, args.split, args.count, names, args.answer_tokens, start=args.start, model=args.model,
               pool_of=args.pool, meta=pooled, target=args.target, asks=args.asks)
    summary, count = summarize(rows), len(rows["full prefill"]["kl"])
    print(table(summary, count))
    print(f"{args.dataset}, {args.split} split, {time.time() - started:.0f} s")
    meta = {"dataset": Path(args.dataset).stem, "split": args.split, "start": args.start, "count": count, **pooled}
    if args.target != "any":
        meta["target"] = args.target
    record.write(args.run_file, {"meta": meta, "methods": summary, "questions": rows})


if __name__ == "__main__":
    main()
