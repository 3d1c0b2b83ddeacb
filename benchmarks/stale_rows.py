"""What can fix a stale row without recomputing it: two measurements against full prefill's V.

    python benchmarks/stale_rows.py --dataset facts --split dev --count 30
    python benchmarks/stale_rows.py --model qwen2.5-0.5b-instruct --dataset facts --split dev --count 30
    python benchmarks/stale_rows.py --dataset ../shared/data/musique_s.json --split dev --count 10 --pool corpus
    python benchmarks/stale_rows.py --quick

The default reads, for each chunk after the prompt's first, its record warmed behind its nearest
neighbour ("plain"); the chunk also has a lead record, warmed alone. A stale row is a reused row the
blend does not recompute: its V at layer l is the record's, where full prefill's differs by the
row's *deviation* D = V_full - V_record. Per prompt (one engine, 1 neighbour with lead records, as
the default; full prefill of the tokenizer's ids as the reference), for every chunk after the first:

1. **The two records.** Does full prefill's V lie between them? Per chunk and layer, the best mix
   ``lead + alpha (plain - lead)`` (least squares over the chunk's rows). Reported per layer: the
   mean and spread of alpha, its correlation with the check layer's alpha over the chunks (what a
   blend could measure: layer 0 is computed over every row, so layer 1's full-prefill V is known),
   and the error of plain, lead, the best mix and the mix at the check layer's alpha, as shares of
   plain's (``ChunkRecord.toward``, ``BlendConfig(lead_after_named=w)``, the ``"nb1 mix A"`` methods).
2. **The recomputed rows' deviations.** The blend recomputes the rows deviating most at the check
   layer (here: ``--share`` of each chunk's rows by V deviation at layer 1, exact there) and so
   knows their deviation at every layer. How much of the other rows' deviation can be guessed from
   it: the chunk's mean (``BlendConfig(spread=A)``), the nearest recomputed row by cosine of the
   record's V, a softmax over those cosines, kernel ridge regression on them, the mean over
   recomputed rows of the same token id (the chunk mean where there is none), and the chunk mean
   scaled by the row's own check-layer deviation. Each estimate E is scored at its best global
   scale a = <D, E> / |E|^2 per layer band: the share of |D|^2 it removes, <D, E>^2 / (|E|^2 |D|^2).
   The recomputed rows' deep deviations are full prefill's here, not the blend's: an upper bound
   on what the blend could know.

V only (K's deviation mixes in RoPE; V's is what the selector ranks by).
"""

from __future__ import annotations

import argparse
import math

import torch

from runfile import RunRecord, add_common

ESTIMATES = ("chunk mean", "nearest", "softmax cos 0.1", "kernel ridge", "same token", "mean x check norm")


def estimates(dev_s: torch.Tensor, plain: torch.Tensor, sel: torch.Tensor, ids: torch.Tensor,
              check_norm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each estimator's guess of the stale rows' deviation [u, dims] from the recomputed rows' ``dev_s``
    [s, dims]; ``plain`` [n, dims] the record's V, ``sel`` [n] bool the recomputed rows, ``ids`` [n]
    token ids, ``check_norm`` [n] each row's deviation norm at the check layer."""
    unit = torch.nn.functional.normalize(plain, dim=1)
    cos = unit[~sel] @ unit[sel].T  # [u, s]
    mean = dev_s.mean(0, keepdim=True).expand(cos.shape[0], -1)
    gram = unit[sel] @ unit[sel].T
    ridge = torch.linalg.solve(gram + 0.1 * gram.diagonal().mean() * torch.eye(gram.shape[0]), dev_s)
    same = (ids[~sel][:, None] == ids[sel][None, :]).float()
    counts = same.sum(1, keepdim=True)
    by_token = torch.where(counts > 0, (same @ dev_s) / counts.clamp_min(1), mean)
    scale = check_norm[~sel] / check_norm[sel].mean().clamp_min(1e-12)
    return {"chunk mean": mean, "nearest": dev_s[cos.argmax(1)], "softmax cos 0.1": torch.softmax(cos / 0.1, 1) @ dev_s,
            "kernel ridge": cos @ ridge, "same token": by_token, "mean x check norm": mean * scale[:, None]}


def flat(x: torch.Tensor) -> torch.Tensor:
    """[heads, n, d] -> [n, heads * d] in fp32."""
    return x.float().transpose(0, 1).reshape(x.shape[1], -1)


def stale_mask(full_v1: torch.Tensor, record_v1: torch.Tensor, share: float) -> torch.Tensor:
    """[n] bool: the rows a blend at ``share`` leaves stale, those outside the top ``share`` by V
    deviation at layer 1 (``full_v1``, ``record_v1``: [n, dims]); at least one row each way."""
    n = full_v1.shape[0]
    stale = torch.ones(n, dtype=torch.bool)
    stale[torch.topk((full_v1 - record_v1).pow(2).sum(1), max(1, min(n - 1, round(share * n)))).indices] = False
    return stale


def bands(layers: int) -> list[tuple[int, int]]:
    """The check layer to the end in quarters: [(1, a), (a, b), ...]."""
    cuts = [1, *(max(2, round(layers * q / 4)) for q in (1, 2, 3)), layers]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def corr(x: list[float], y: list[float]) -> float:
    if len(x) < 2:
        return float("nan")
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / (sx * sy) if sx and sy else float("nan")


class Tally:
    """Sums over every (prompt, chunk after the first) of both measurements, per layer."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.alpha: list[list[float]] = []  # per chunk: the best mix per layer
        self.dd: list[torch.Tensor] = []  # per chunk: |plain - lead|^2 per layer
        self.fd: list[torch.Tensor] = []  # per chunk: <f - lead, plain - lead> per layer
        self.fl: list[torch.Tensor] = []  # per chunk: |f - lead|^2 per layer
        self.fp: list[torch.Tensor] = []  # per chunk: |f - plain|^2 per layer
        self.stale = torch.zeros(layers)  # |D_u|^2
        self.dot = {e: torch.zeros(layers) for e in ESTIMATES}  # <D_u, E>
        self.sq = {e: torch.zeros(layers) for e in ESTIMATES}  # |E|^2

    def chunk(self, full: list[torch.Tensor], plain: torch.Tensor, lead: torch.Tensor, ids: torch.Tensor,
              share: float) -> None:
        """One chunk: ``full`` per layer [n, dims] full prefill's V of its rows, ``plain``/``lead``
        [layers, n, dims] its records' V of the same rows."""
        dd, fd, fl, fp = (torch.zeros(self.layers) for _ in range(4))
        for layer, f in enumerate(full):
            d, fl_vec = plain[layer] - lead[layer], f - lead[layer]
            dd[layer], fd[layer] = d.pow(2).sum(), (fl_vec * d).sum()
            fl[layer], fp[layer] = fl_vec.pow(2).sum(), (f - plain[layer]).pow(2).sum()
        self.dd.append(dd), self.fd.append(fd), self.fl.append(fl), self.fp.append(fp)
        self.alpha.append((fd / dd.clamp_min(1e-12)).tolist())
        n = plain.shape[1]
        if n < 3:  # no stale row left to guess, or nothing to guess it from
            return
        check = (full[1] - plain[1]).pow(2).sum(1)
        sel = ~stale_mask(full[1], plain[1], share)
        for layer in range(1, self.layers):
            dev = full[layer] - plain[layer]
            self.stale[layer] += dev[~sel].pow(2).sum()
            for name, guess in estimates(dev[sel], plain[layer], sel, ids, check.sqrt()).items():
                self.dot[name][layer] += (dev[~sel] * guess).sum()
                self.sq[name][layer] += guess.pow(2).sum()

    def records_summary(self) -> dict:
        """Measurement 1 per layer: alpha's mean, sd, correlation with the check layer's; errors as shares of plain's."""
        at_check = [a[1] for a in self.alpha]
        fp, fl = sum(self.fp), sum(self.fl)
        out = {"alpha_mean": [], "alpha_sd": [], "alpha_corr_check": [], "lead_over_plain": [], "best_over_plain": [],
               "check_alpha_over_plain": []}
        for layer in range(self.layers):
            col = [a[layer] for a in self.alpha]
            mean = sum(col) / len(col)
            out["alpha_mean"].append(mean)
            out["alpha_sd"].append(math.sqrt(sum((a - mean) ** 2 for a in col) / len(col)))
            out["alpha_corr_check"].append(corr(at_check, col))
            best = sum(c[layer] - f[layer] ** 2 / d[layer].clamp_min(1e-12) for c, f, d in zip(self.fl, self.fd, self.dd))
            chosen = sum(c[layer] - 2 * a * f[layer] + a * a * d[layer]
                         for c, f, d, a in zip(self.fl, self.fd, self.dd, (min(max(x, 0.0), 1.0) for x in at_check)))
            out["lead_over_plain"].append(float(fl[layer] / fp[layer]))
            out["best_over_plain"].append(float(best / fp[layer]))
            out["check_alpha_over_plain"].append(float(chosen / fp[layer]))
        return out

    def estimates_summary(self) -> dict:
        """Measurement 2 per layer band: each estimator's removed share and best scale."""
        out = {}
        for lo, hi in bands(self.layers):
            stale = float(self.stale[lo:hi].sum())
            row = {}
            for name in ESTIMATES:
                dot, sq = float(self.dot[name][lo:hi].sum()), float(self.sq[name][lo:hi].sum())
                row[name] = {"removed": dot * dot / (sq * stale) if sq and stale else 0.0, "scale": dot / sq if sq else 0.0}
            out[f"{lo}-{hi - 1}"] = row
        return out


def warmed_examples(model: str, dataset: str, pool: str, spans: list[tuple[str, int, int]]):
    """(engine, examples per span): an engine with the default's warming (1 neighbour, lead
    records) and ``select_eval``'s examples of each (split, start, count) span, their passages
    warmed, neighbours picked among them (``pool="run"``) or the whole MuSiQue file's (``"corpus"``)."""
    import select_eval
    from cacheblend import BlendConfig, BlendEngine, shared_engine

    shared = shared_engine(model)
    engine = BlendEngine(shared.adapter.model, shared.tokenizer, config=BlendConfig(neighbours=1), memory_bytes=12 << 30)
    sets = [select_eval.examples(dataset, split, count, engine, start) for split, start, count in spans]
    passages = sorted({p for qs in sets for q in qs for p in q.passages})
    engine.kv.warmer.learn([], select_eval.corpus(dataset) if pool == "corpus" else passages)
    engine.warm(passages, progress=False)
    return engine, sets


def ask(engine, q):
    """``q``'s request as select_eval builds it (its system message and question wording)."""
    import select_eval

    return engine.request(chunks=q.passages, query=select_eval.ask(engine.tokenizer, q.question), prefix=select_eval.PREFIX)


def later_chunks(engine, request):
    """Per chunk after the prompt's first (which reads its lead record, full prefill's context for
    it): (its record warmed behind its neighbour, its lead record, its rows in the prompt, the same
    rows in the records, their token ids)."""
    from cacheblend.prompts.assemble import aligned_rows, chunk_encodings

    spans = list(zip(request.text.chunks, chunk_encodings(request.text, engine.kv.encode)))
    for span, enc in spans[1:]:
        plain, lead = (engine.kv.stores.get(k) for k in engine.kv.record_keys(enc.ids))
        rows, own = (torch.tensor(x) for x in aligned_rows(request.encoding, span, enc))
        yield plain, lead, rows, own, torch.tensor(enc.ids)[own]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="1 development fact question")
    ap.add_argument("--dataset", default="facts", help="facts, pydoc or a MuSiQue-format JSON")
    ap.add_argument("--split", default="dev", choices=("dev", "report"))
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--share", type=float, default=0.15, help="of each chunk's rows recomputed, by check-layer deviation")
    ap.add_argument("--pool", default="run", choices=("run", "corpus"), help="where neighbours are picked (select_eval's)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.quick:
        args.count = 1
    record = RunRecord.start(args)
    torch.set_num_threads(args.threads)
    engine, (qs,) = warmed_examples(args.model, args.dataset, args.pool, [(args.split, args.start, args.count)])
    tally = Tally(engine.adapter.num_layers)
    for i, q in enumerate(qs):
        request = ask(engine, q)
        kv = engine.prefill(request, recompute_ratio=1.0).output.kv
        for plain, lead, rows, own, ids in later_chunks(engine, request):
            full = [flat(layer[1][0][:, rows]) for layer in kv]
            tally.chunk(full, torch.stack([flat(r[1][:, own]) for r in plain.kv]),
                        torch.stack([flat(r[1][:, own]) for r in lead.kv]), ids, args.share)
        print(f"{i + 1}/{len(qs)}", flush=True)
    records, guesses = tally.records_summary(), tally.estimates_summary()
    for lo, hi in bands(tally.layers):
        span = range(lo, hi)
        mean = {k: sum(records[k][j] for j in span) / len(span) for k in records}
        print(f"layers {lo}-{hi - 1}: alpha {mean['alpha_mean']:.2f} (sd {mean['alpha_sd']:.2f}, corr with the check "
              f"layer's {mean['alpha_corr_check']:.2f}); error / plain's: lead {mean['lead_over_plain']:.2f}, best mix "
              f"{mean['best_over_plain']:.3f}, the check layer's mix {mean['check_alpha_over_plain']:.3f}")
        print("  stale deviation removed: " + ", ".join(
            f"{k} {v['removed']:.3f} (x{v['scale']:.2f})" for k, v in guesses[f"{lo}-{hi - 1}"].items()))
    record.write(args.run_file, {"model": args.model, "dataset": args.dataset, "split": args.split, "start": args.start,
                                 "count": len(qs), "chunks": len(tally.alpha), "share": args.share, "pool": args.pool,
                                 "records": records, "estimates": guesses})


if __name__ == "__main__":
    main()
