"""``cacheblend bench``: TTFT and quality of full prefill, prefix caching, full reuse and CacheBlend.

For each prompt (``chunks`` passages + a question, wrapped by the chat template) and method:

- TTFT: the median of ``repeats`` runs of the time from the call until the first token is
  available to the caller: tokenization, KV loading, the prefill, and building the decode cache.
  For the blended methods the memory tier is emptied before every run, so chunk KV is read from
  the disk store each time (what a fresh serving process sees).
- floor: full prefill's row-layers over the method's, counted from the rows each prefill computed
  (``cost.prefill_rows``): for a one-pass blend at recompute share s, with L layers of which the
  first f (before the first check layer) run over every token, L / (f + (L - f) * s); a two-stage
  blend (``QuestionSelector``: Qwen's default where the question names no chunk) runs no such
  prelude and adds its first stage's rows. It ignores attention's quadratic part and fixed costs,
  so it is a reference, not a bound.
- MAC floor: full prefill's multiply-accumulates over the method's, counted from the rows each
  prefill computed, attention included (``cost.py``): the speedup if every one ran at full
  prefill's rate. A method's TTFT over it is what loading, realigning and selecting cost, plus
  the kernels' different rates.
- of floor (rows; MACs): per prompt, the speedup over that prompt's full prefill divided by that
  prompt's floor, the median over prompts. An auto budget recomputes more of one prompt than of
  another, so the median TTFT and the floor at the mean share describe different prompts: only
  the per-prompt ratio says how close the method runs to its own floor.
- first stage (the run file's ``first_stage_s``): the median time of a two-stage blend's first
  stage (``BlendStats.first_stage_s``: its full-reuse pass, a draft's passes), part of its TTFT.
- KL: mean KL(full prefill || method) over the tokens of the full-prefill greedy answer; beside
  it, as a share of full reuse's KL: of the default's own records ("full reuse", ratio 0 through
  the same engine) and, when the default warms behind neighbours, of chunks warmed alone
  (CacheBlend's records). A blend is only worth its recompute where it is well below both.
- F1 vs full: token F1 between the method's greedy answer and full prefill's.
- F1 vs gold (MuSiQue): token F1 against the best gold answer.

Speedups are ratios within one run: absolute times on shared CPUs are noisy, ratios much less so.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace

import torch

from ..blending.blend import BlendInput, blend_prefill
from ..blending.head import head_forward
from ..blending.selection import NoneSelector
from ..engine import BlendEngine
from ..generation.decode import Prefilled
from ..result import BlendStats
from ..stores import MemoryStore
from .cost import prefill_macs, prefill_rows
from .datasets import QAExample
from .quality import answer_kl, best_f1, token_f1

QA_PREFIX = "Answer the question using the passages. Reply with a short answer only."
REUSE_ALONE = "full reuse (chunks warmed alone)"


@dataclass
class MethodResult:
    name: str
    ratio: float | None
    ttft_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    first_stage_s: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    f1_full: list[float] = field(default_factory=list)
    f1_gold: list[float] = field(default_factory=list)
    recomputed_share: list[float] = field(default_factory=list)
    macs: list[int] = field(default_factory=list)  # per prompt: what its prefill computed (cost.py)
    rows: list[int] = field(default_factory=list)  # per prompt: the row-layers it computed (cost.py)

    def summary(self, full: MethodResult) -> dict:
        """The row of the table; ``full``: full prefill's results over the same prompts, in order."""
        share = statistics.mean(self.recomputed_share)
        ttft, full_ttft = statistics.median(self.ttft_s), statistics.median(full.ttft_s)
        speedups = [f / t for f, t in zip(full.ttft_s, self.ttft_s)]  # per prompt
        rows = [s * m / f for s, f, m in zip(speedups, full.rows, self.rows)]  # speedup / (full rows / rows)
        macs = [s * m / f for s, f, m in zip(speedups, full.macs, self.macs)]  # speedup / (full MACs / MACs)
        return {
            "method": self.name,
            "ratio": self.ratio,
            "ttft_s": ttft,
            "speedup": full_ttft / ttft,
            "load_s": statistics.median(self.load_s),
            "first_stage_s": statistics.median(self.first_stage_s) if self.first_stage_s else 0.0,
            "kl": statistics.mean(self.kl),
            "f1_vs_full": statistics.mean(self.f1_full),
            "f1_vs_gold": statistics.mean(self.f1_gold) if self.f1_gold else None,
            "recomputed_share": share,
            "floor": statistics.mean(full.rows) / statistics.mean(self.rows),
            "mac_floor": statistics.mean(full.macs) / statistics.mean(self.macs),
            "of_floor": statistics.median(rows),
            "of_mac_floor": statistics.median(macs),
            "per_prompt": {
                "ttft_s": self.ttft_s, "macs": self.macs, "rows": self.rows, "recomputed_share": self.recomputed_share
            },
        }


def compute_floor(num_layers: int, full_layers: int, share: float) -> float:
    """Compute-bound speedup over full prefill: ``full_layers`` layers over every token, the
    others over the recomputed ``share`` of them (see the module docstring)."""
    return num_layers / (full_layers + (num_layers - full_layers) * share)


def methods(engine: BlendEngine, ratios: tuple[float, ...], baseline: BlendEngine | None = None) -> dict[str, tuple]:
    """Method name -> (config, engine): config None for the two non-blending baselines.

    ``baseline``: an engine of the same model whose chunks are warmed alone; when ``engine``
    warms behind neighbours, CacheBlend itself (deviation, chunks alone), EPIC's chunk-start
    selection (both at 15%) and full reuse run on it, so the table shows what neighbour-aware
    warming adds, and the blend is read against both full reuses: of its own records and of
    chunks warmed alone.
    """
    out: dict[str, tuple] = {"full prefill": (None, engine), "prefix caching": (None, engine)}
    out["full reuse"] = (replace(engine.config, ratios=(0.0,), check_layers=(1,), auto_budget=False), engine)
    for r in ratios:
        out[f"cacheblend {round(r * 100)}%"] = (engine.config.with_ratio(r), engine)
    if engine.config.auto_budget:  # the engine's own per-request budget (Qwen's default: the named chunk)
        out["cacheblend auto"] = (engine.config, engine)
    if baseline is not None:  # CacheBlend's own selector, whatever the engine's
        alone = replace(engine.config.with_ratio(0.15), neighbours=0, selector="deviation")
        out["CacheBlend 15% (chunks warmed alone)"] = (alone, baseline)
        out["EPIC chunk start 15% (alone)"] = (replace(alone, selector="chunk_start"), baseline)
        out[REUSE_ALONE] = (replace(alone, ratios=(0.0,), check_layers=(1,)), baseline)
    return out


class PrefixCache:
    """The prefix-caching baseline: the KV of the prompt's common leading tokens (the chat
    template's header before the first chunk) is computed once; each request computes every
    other token at every layer. It runs through the same kernels as the other methods (the
    blend loop with the prefix as its head, ``blending/head.py``, and nothing reused), so the
    comparison is between algorithms, not attention implementations."""

    def __init__(self, engine: BlendEngine, prefix_ids: list[int]) -> None:
        self.engine, self.prefix_ids = engine, prefix_ids
        self.kv = head_forward(engine.adapter, torch.tensor(prefix_ids, device=engine.adapter.device))

    def prefill(self, ids: list[int]) -> Prefilled:
        assert ids[: len(self.prefix_ids)] == self.prefix_ids, "prompt does not start with the cached prefix"
        started = time.perf_counter()
        n, n0 = len(ids), len(self.prefix_ids)
        ids_t = torch.tensor(ids, device=self.kv.device)
        none = torch.zeros_like(ids_t, dtype=torch.bool)
        inp = BlendInput(ids=ids_t, reused=none, cached=None, chunk_offsets=torch.zeros_like(ids_t), head_kv=self.kv)
        out = blend_prefill(self.engine.adapter, inp, NoneSelector(), {0: 0.0})
        stats = BlendStats(prompt_tokens=n, reused_tokens=n0, recomputed_tokens=n - n0, recompute_ratio=1.0)
        stats.prefill_s = time.perf_counter() - started
        return Prefilled(self.engine.adapter, ids_t, out, stats)


@dataclass(frozen=True)
class BenchOptions:
    """What ``run`` measures: CacheBlend at each recompute ratio of ``ratios``, each TTFT the median
    of ``repeats`` runs, the quality columns over greedy answers of ``answer_tokens`` tokens."""

    ratios: tuple[float, ...] = (0.05, 0.15, 0.30)
    repeats: int = 3
    answer_tokens: int = 32


def run(
    engine: BlendEngine,
    examples: list[QAExample],
    *,
    options: BenchOptions = BenchOptions(),
    baseline: BlendEngine | None = None,
    log=print,
) -> list[dict]:
    """Runs every method on every example; returns one summary row per method. Each engine's head
    cache holds the prompts' head (the same QA system message) before anything is timed: the
    steady state of a served application, as the chunks are warmed before (``blending/head.py``)."""
    repeats, answer_tokens = options.repeats, options.answer_tokens
    table = methods(engine, options.ratios, baseline)
    results = {name: MethodResult(name, None if cfg is None else cfg.recompute_ratio) for name, (cfg, _) in table.items()}
    results["full prefill"].ratio = 1.0
    first = examples[0]
    first_text = engine.request(chunks=first.passages, query=first.question, prefix=QA_PREFIX).text
    prefix = PrefixCache(engine, engine.token_ids(first_text.text[: first_text.chunks[0].start]))
    for eng in {id(e): e for _, e in table.values()}.values():  # the steady state, as chunks are warmed before:
        head = eng.request(chunks=first.passages, query=first.question, prefix=QA_PREFIX)  # the prompts' head
        eng.prefiller.heads.kv(eng.adapter, torch.tensor(head.ids[: head.head_tokens], device=eng.adapter.device))
    for i, ex in enumerate(examples):
        req = dict(chunks=ex.passages, query=ex.question, prefix=QA_PREFIX)
        full = _timed(lambda: engine.prefill(**req, recompute_ratio=1.0), repeats, results["full prefill"], None)
        reference = engine.generate_from(full, max_new_tokens=answer_tokens)
        ids = full.ids.tolist()
        for name, (cfg, eng) in table.items():
            res = results[name]
            if name == "full prefill":
                pre, answer = full, reference
            elif name == "prefix caching":
                pre = _timed(lambda: prefix.prefill(ids), repeats, res, None)
                answer = engine.generate_from(pre, max_new_tokens=answer_tokens)
            else:
                pre = _timed(lambda: eng.prefill(**req, config=cfg), repeats, res, eng)
                answer = engine.generate_from(pre, max_new_tokens=answer_tokens)
            res.kl.append(answer_kl(full, pre, reference.token_ids) if pre is not full else 0.0)
            res.f1_full.append(token_f1(answer.text, reference.text))
            if ex.answers:
                res.f1_gold.append(best_f1(answer.text, ex.answers))
            res.recomputed_share.append(pre.stats.recomputed_tokens / pre.stats.prompt_tokens)
            res.macs.append(prefill_macs(engine.adapter, pre.output).total)
            res.rows.append(prefill_rows(pre.output))
        log(f"[{i + 1}/{len(examples)}] {len(ids)} tokens; full {results['full prefill'].ttft_s[-1]:.2f}s")
    return [r.summary(results["full prefill"]) for r in results.values()]


def throughput(engine: BlendEngine, examples: list[QAExample], rows: list[dict]) -> dict:
    """Warming rates (``engine.warm`` of the first prompt's passages in a memory-only engine on the
    same model and config, batch 8) against full-prefill tokens/s (the median full-prefill TTFT
    over the first prompt's length): chunk tokens/s, and computed tokens/s (each chunk's context
    and, with ``neighbours`` > 0, its neighbours' tokens included: the compute efficiency)."""
    scratch = BlendEngine(engine.adapter.model, engine.tokenizer, config=engine.config)
    passages = examples[0].passages
    started = time.perf_counter()
    scratch.warm(passages, progress=False)
    elapsed = time.perf_counter() - started
    warm = sum(len(scratch.kv.encode(p).ids) for p in passages) / elapsed
    n = len(engine.request(chunks=passages, query=examples[0].question, prefix=QA_PREFIX).ids)
    full = n / row(rows, "full prefill")["ttft_s"]
    return {"warming_tokens_per_s": warm, "warming_computed_tokens_per_s": scratch.kv.tokens_warmed / elapsed,
            "full_prefill_tokens_per_s": full, "neighbours": engine.kv.neighbours}


def _timed(make, repeats: int, res: MethodResult, engine: BlendEngine | None) -> Prefilled:
    """Runs ``make`` ``repeats`` times (after emptying the memory tier when ``engine`` is given);
    records the median TTFT and load time; returns the last prefill."""
    ttfts, loads, stages = [], [], []
    for _ in range(repeats):
        if engine is not None and any(not t.shared for t in engine.kv.stores.attached):  # a local store is attached
            engine.kv.stores.memory = MemoryStore(engine.kv.stores.memory.max_bytes)
        started = time.perf_counter()
        pre = make()
        pre.cache()  # the decode cache: needed before the first token reaches the caller
        pre.stats.ttft_s = time.perf_counter() - started
        ttfts.append(pre.stats.ttft_s)
        loads.append(pre.stats.load_s)
        stages.append(pre.stats.first_stage_s)
    res.ttft_s.append(statistics.median(ttfts))
    res.load_s.append(statistics.median(loads))
    res.first_stage_s.append(statistics.median(stages))
    return pre


def row(rows: list[dict], name: str) -> dict:
    """The summary row of method ``name``."""
    return next(r for r in rows if r["method"] == name)
