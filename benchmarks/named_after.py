"""What the chunks after the named one hold: the named chunk recomputed whole with the chunks that follow it.

    .venv/bin/python benchmarks/named_after.py --model qwen2.5-0.5b-instruct --split dev --count 100 --methods "nb1 lexical named,nb1 named next,nb1 named after"
    .venv/bin/python benchmarks/named_after.py --quick     # 1 dev fact question, the named chunk and "nb1 named after"
    .venv/bin/python benchmarks/named_after.py --by-target docs/runs/named_after_dev_qwen.json   # runs nothing
    .venv/bin/python benchmarks/named_after.py --lost docs/runs/named_lead_after_dev_qwen.json     # runs nothing
    .venv/bin/python benchmarks/named_after.py --gate RUN_FILE TALLY_FILE "BASE" "LEAD"   # runs nothing

On Qwen 0.5B's development facts the named chunk's budget (Qwen's default) loses the answers full
prefill gets right mostly where the passage the question names is the prompt's second: there it
is recomputed behind the first passage's lead record, exactly as full prefill computes it, and
four stale passages follow it. Recomputing it whole does not repair those: in full prefill they
have read the named passage, here they were warmed behind a neighbour of their own. This script
measures what recomputing them too is worth, and what it costs:

- ``"nb1 named next"``: the named chunk and the one after it, whole;
- ``"nb1 named after"``: the named chunk and every chunk after it, whole.

Two more, between the two records of each chunk after the named one: ``"nb1 named mix after 0.5"``
reads their mean (``BlendConfig(lead_after_named=0.5)``, ``ChunkRecord.toward``; the run files of
stop 35 made it with a records hook here, the same arithmetic), ``"nb1 named half lead after"``
(research only) the neighbour-warmed record's first half of the layers and the lead record's
second half.

``--by-target`` reads a select_eval run file of the generated facts and prints, per place of the
answer's passage in the prompt, how many answers full prefill gets right and how many each method
loses of them (the questions are generated again from the run's split, start and count).
``--lost`` reads the same files and says where each lost answer's value comes from: a value of
another passage of the prompt (before or after the answer's passage), another attribute of the
answer's own passage, or none of the prompt's values.

``--gate`` reads a run file with two methods, ``BASE`` and ``LEAD`` (``BASE`` with
``lead_after_named``), and ``named_ties.py --tally``'s file of the same prompts, and prints what
``lead_after_margin=M`` would give for M from 0 to 0.7: per question ``LEAD``'s result where the
prompt's named chunk leads the next by at least M (``lexical.lead_margin`` of the tally's scores),
``BASE``'s elsewhere, the only prompts where the two differ (stop 52, docs/LEXICAL-SELECTOR.md).

And one that recomputes nothing more, the answer to the diagnosis (the passages after the named one
are what misleads the question, so they read the other record each chunk has):

- ``"nb1 named lead after"``: the named chunk recomputed whole, as ``"nb1 lexical named"``, and every
  chunk after it reads its lead record (warmed behind the chunk context alone) instead of its
  record warmed behind a neighbour; the chunks before it read what the default reads
  (``BlendConfig(lead_after_named=True)``: the named chunk is found before the blend from the
  chunks' ids and the question's, ``lexical.named_before_blend``; the runs made at d7929f1 and
  cbf70f6 made the same choice with a records hook in this script);
- ``"lexical named"``: the named chunk's budget over chunks warmed alone (every chunk reads the
  record CacheBlend's warming makes; the lead records are those).

And two that recompute a little more than the named chunk, not whole passages (stop 45):
``"nb1 named windows after W"`` adds, in every chunk after the named one, W tokens either side of
each occurrence of a question token that is not common (``NamedWindows``: the competing sentences),
``"nb1 named windows W"`` the same in every other chunk. Two controls: ``"nb1 named deviation
after W"`` adds as many tokens of the chunks after the named one by V deviation instead,
``"nb1 named within after W"`` keeps the named chunk's budget (the windows, then the named chunk's
most deviating tokens up to its size).

Every method falls back to the named chunk's budget (5% by deviation) where the question names no
chunk, or names the first one read alone. ``"nb1 named next"`` and ``"nb1 named after"`` are
measurements, not product options: the recompute they spend is whatever the chunks hold (the
``recomputed`` column says it), above the goals' 15% mean. Every other argument is
select_eval.py's, so the tables, run files and the full-prefill reference are its.
"""

from __future__ import annotations

import json
import sys
import re
from collections import Counter
from dataclasses import replace

import torch

import select_eval
from cacheblend.blending.lexical import chunk_scores, lead_margin, named_chunk
from cacheblend.blending.selection import Candidates, DeviationSelector, _top
from cacheblend.stores.record import ChunkRecord
from cacheblend.tools.factset import entities


class NamedAfter:
    """The chunk the question names (``lexical.named_chunk``) and the ``after`` chunks that follow
    it (None: all of them), every token; deviation at the budget where it names none."""

    needs_query = False

    def __init__(self, after: int | None) -> None:
        self.after = after

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        chunk = cand.chunks()  # [n]
        best = named_chunk(chunk_scores(cand.ids, chunk, cand.question_ids), cand.first_alone)
        if best is None:
            return DeviationSelector("v")(cand, budget)
        last = int(chunk.max()) if self.after is None else best + self.after
        return ((chunk >= best) & (chunk <= last)).nonzero().flatten()


class NamedWindows:
    """The named chunk whole (as ``NamedAfter(0)``) and, in the chunks after it (``after_only``) or
    in every other chunk, ``width`` tokens either side of each occurrence of a question token
    that is not common (at most two per chunk on average: not " the", "." or the template's
    newline): the sentences that compete with the named one for the question's attention (a
    distractor's "Its founder was ..." when the question asks who founded), recomputed over the
    whole prompt. Research (stop 45); deviation at the budget where the question names none."""

    needs_query = False

    def __init__(self, width: int, after_only: bool = True, mode: str = "windows") -> None:
        if mode not in ("windows", "deviation", "within"):
            raise ValueError(f"mode: windows, deviation or within; got {mode!r}")
        self.width, self.after_only, self.mode = width, after_only, mode

    def __call__(self, cand: Candidates, budget: int) -> torch.Tensor:
        chunk = cand.chunks()  # [n]
        best = named_chunk(chunk_scores(cand.ids, chunk, cand.question_ids), cand.first_alone)
        if best is None:
            return DeviationSelector("v")(cand, budget)
        asked = cand.question_ids.unique()
        count = (cand.ids[:, None] == asked[None, :]).sum(0)  # [m'] occurrences among the reused tokens
        rare = asked[(count > 0) & (count <= 2 * (int(chunk.max()) + 1))]
        hit = torch.isin(cand.ids, rare) & ((chunk > best) if self.after_only else (chunk != best))
        at = hit.nonzero().flatten()  # [h]
        span = at[:, None] + torch.arange(-self.width, self.width + 1)[None, :]  # [h, 2w+1]
        span = span.clamp(0, chunk.numel() - 1)
        span = span[chunk[span] == chunk[at][:, None]]  # inside the hit's own chunk
        named = chunk == best
        window = torch.zeros_like(named)
        window[span] = True
        if self.mode == "windows":
            return (named | window).nonzero().flatten()
        deviation = DeviationSelector("v").scores(cand)
        if self.mode == "deviation":  # the control: as many tokens, in the same chunks, by deviation
            pool = (chunk > best) if self.after_only else (chunk != best)
            extra = _top(torch.where(pool, deviation, -1.0), int(window.sum()))
            return torch.cat([named.nonzero().flatten(), extra])
        # "within": the windows, then the named chunk's most deviating tokens up to its own size
        inside = _top(torch.where(named, deviation, -1.0), max(0, int(named.sum()) - int(window.sum())))
        return torch.cat([window.nonzero().flatten(), inside])


def deeper_half_lead(warmed):
    """A records function over ``warmed``'s records (1 neighbour, with lead records) for a config
    with ``lead_after_named`` (research, stop 35): the records the default reads, but every chunk
    from ``lead_from`` on reads its neighbour-warmed record's first half of the layers and its
    lead record's second half."""

    def lookup(chunks: list[list[int]], lead_from: int | None = None, lead_weight: float = 1.0):  # weight: unused
        near, out = warmed.kv.records(chunks), []
        lead = warmed.kv.records(chunks, lead_from) if lead_from is not None else near
        for i, (a, b) in enumerate(zip(near, lead)):
            half = a.kv.shape[0] // 2
            out.append(a if lead_from is None or i < lead_from else
                       ChunkRecord(a.key, torch.cat([a.kv[:half], b.kv[half:]]), a.text))
        return out

    return lookup


def register() -> None:
    """Adds this script's methods to select_eval's, each over the named chunk's config (its
    budget; its records, except "lexical named": chunks warmed alone, and the two between a
    chunk's records after the named one: the product's ``lead_after_named=0.5``, and
    ``deeper_half_lead``)."""
    config = select_eval.METHODS["nb1 lexical named"][0]
    select_eval.METHODS["nb1 named next"] = (config, NamedAfter(1))
    select_eval.METHODS["nb1 named after"] = (config, NamedAfter(None))
    select_eval.METHODS["nb1 named windows after 4"] = (config, NamedWindows(4))
    select_eval.METHODS["nb1 named windows 4"] = (config, NamedWindows(4, after_only=False))
    for mode in ("deviation", "within"):  # the two controls
        select_eval.METHODS[f"nb1 named {mode} after 4"] = (config, NamedWindows(4, mode=mode))
    select_eval.METHODS["lexical named"] = (replace(config, neighbours=0), None)
    select_eval.METHODS["nb1 named lead after"] = (replace(config, lead_after_named=True), None)
    select_eval.METHODS["nb1 named mix after 0.5"] = (replace(config, lead_after_named=0.5), None)
    half = "nb1 named half lead after"  # read through select_eval's records hook for placed records
    select_eval.METHODS[half] = (replace(config, lead_after_named=True), None)
    select_eval.PRESENT[half] = half
    placed = select_eval._placed_records
    select_eval._placed_records = lambda warmed, pool: (
        lambda flag: deeper_half_lead(warmed) if flag == half else placed(warmed, pool)(flag))


def _facts_run(path: str) -> tuple[dict, dict, list]:
    """(meta, per-question rows, the questions regenerated) of a select_eval run of the facts."""
    run = json.load(open(path))
    if "questions" not in run:
        raise SystemExit(f"{path}: no per-question rows (select_eval keeps them since stop 33)")
    meta, rows = run["meta"], run["questions"]
    if meta["dataset"] != "facts" or meta.get("target", "any") != "any":
        raise SystemExit(f"{path}: --by-target and --lost read runs of the generated facts in their own order")
    return meta, rows, select_eval.questions(meta["split"], meta["start"] + meta["count"])[meta["start"]:]


def by_target(path: str) -> str:
    """The table ``--by-target`` prints: per target place, answers full prefill gets right, and
    per method how many of them it loses."""
    meta, rows, qs = _facts_run(path)
    methods = [m for m in rows if m != "full prefill"]
    right = [i for i, r in enumerate(rows["full prefill"]["right"]) if r]
    kept_able = Counter(qs[i].target for i in right)
    lines = ["| answer's passage | full prefill right | " + " | ".join(f"{m}: lost" for m in methods) + " |",
             "|---|---|" + "---|" * len(methods)]
    for place in sorted(kept_able):
        lost = [sum(1 for i in right if qs[i].target == place and not rows[m]["right"][i]) for m in methods]
        lines.append(f"| {place + 1} of 6 | {kept_able[place]} | " + " | ".join(map(str, lost)) + " |")
    lost = [sum(1 for i in right if not rows[m]["right"][i]) for m in methods]
    lines.append(f"| all | {len(right)} | " + " | ".join(map(str, lost)) + " |")
    return "\n".join(lines)


SOURCES = ("another passage, before the answer's", "another passage, after the answer's",
           "the answer's passage, another attribute", "no value of the prompt")


def value_source(answer: str, passages: list[str], target: int, values: set[str]) -> str:
    """Where a wrong ``answer``'s value comes from (one of ``SOURCES``): ``values`` holds every
    value of the split's entities (years, founders, cities, emblems); the first one the answer
    names (word-bounded) that a prompt passage holds decides, the answer's own passage first
    (an emblem or a year can belong to several entities)."""
    def names(v: str, text: str) -> bool:
        return re.search(rf"\b{re.escape(v)}\b", text) is not None

    for _, value in sorted((m.start(), v) for v in values for m in re.finditer(rf"\b{re.escape(v)}\b", answer)):
        if names(value, passages[target]):
            return SOURCES[2]
        holders = [i for i, p in enumerate(passages) if names(value, p)]
        if holders:
            return SOURCES[0] if holders[0] < target else SOURCES[1]
    return SOURCES[3]


def lost(path: str) -> str:
    """The table ``--lost`` prints: per method, its answers full prefill gets right that it
    loses, by where the value it answered comes from (``value_source``)."""
    meta, rows, qs = _facts_run(path)
    values = {v for e in entities(meta["split"], 40) for v in (e.year, e.founder, e.city, e.emblem)}  # questions' pool
    right = [i for i, r in enumerate(rows["full prefill"]["right"]) if r]
    lines = ["| method | lost | " + " | ".join(SOURCES) + " |", "|---|---|" + "---|" * len(SOURCES)]
    for m in (m for m in rows if m != "full prefill"):
        gone = [i for i in right if not rows[m]["right"][i]]
        where = Counter(value_source(rows[m]["answer"][i], qs[i].passages, qs[i].target, values) for i in gone)
        lines.append(f"| {m} | {len(gone)} | " + " | ".join(str(where[s]) for s in SOURCES) + " |")
    return "\n".join(lines)


MARGINS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def gate(path: str, tally: str, base: str, lead: str) -> str:
    """The table ``--gate`` prints: ``lead_after_margin`` at each of ``MARGINS``, from the per-question
    rows of ``base`` and ``lead`` in the run file ``path`` and the chunk scores in ``tally``."""
    run, scores = json.load(open(path)), {p["index"]: p["scores"] for p in json.load(open(tally))["prompts"]}
    rows, start = run["questions"], run["meta"]["start"]
    if base not in rows or lead not in rows:
        raise SystemExit(f"{path}: needs per-question rows of {base!r} and {lead!r}; it has {sorted(rows)}")
    n = len(rows["full prefill"]["right"])
    margin = []
    for j in range(n):
        s = torch.tensor(scores[start + j])  # a KeyError: the tally does not cover the run's prompts
        margin.append(-1.0 if named_chunk(s, first_alone=True) is None else lead_margin(s))
    gated = {m: {k: [rows[lead if margin[j] >= m else base][k][j] for j in range(n)] for k in rows[base]} for m in MARGINS}
    means = select_eval.summarize({"full prefill": rows["full prefill"], **gated, f"({base})": rows[base]})
    lines = [f"| lead_after_margin | prompts gated in (of {n}) | kept | same answer | answer F1 vs full | mean KL |",
             "|---|---|---|---|---|---|"]
    for m, r in ((k, v) for k, v in means.items() if k != "full prefill"):
        inside = sum(x >= m for x in margin) if m in MARGINS else 0
        kept = "-" if r["kept"] is None else r["kept"]
        lines.append(f"| {m} | {inside} | {kept} | {round(r['agree'] * n)} | {r['f1']:.3f} | {r['kl']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--gate"]:
        if len(argv) != 5:
            raise SystemExit("usage: named_after.py --gate RUN_FILE TALLY_FILE BASE LEAD")
        print(gate(*argv[1:]))
        return
    if argv[:1] in (["--by-target"], ["--lost"]):
        table = by_target if argv[0] == "--by-target" else lost
        for path in argv[1:]:
            print(f"{path}\n{table(path)}\n")
        return
    register()
    select_eval.main_with(__doc__, "nb1 lexical named,nb1 named after,nb1 named lead after", argv)


if __name__ == "__main__":
    main()
