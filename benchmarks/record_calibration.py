"""A learned correction of stale rows: per-layer affine maps from a record's K/V to full prefill's.

    python benchmarks/record_calibration.py --dataset facts --fit 30 --count 60
    python benchmarks/record_calibration.py --model qwen2.5-0.5b-instruct --dataset facts --fit 30 --count 60
    python benchmarks/record_calibration.py --quick

``stale_rows.py`` finds that a stale row's deviation (full prefill's V minus its record's) is not
guessed by the recomputed rows' deviations. This asks whether it is guessed by the record itself:
the default's records (1 neighbour, lead records) of the chunks after the prompt's first are
systematically off in a way a linear map learns. On ``--fit`` development prompts, per layer, ridge
regression from ``[record row, 1]`` to full prefill's row minus the record's, fitted on the rows a
15% deviation blend leaves stale (each chunk's rows outside its top 15% by V deviation at layer 1),
for V and for K before RoPE (full prefill's keys are rotated back from their positions). Then, on
the next ``--count`` development prompts (held out from the fit, full prefill of the tokenizer's ids
the reference):

- the share of the stale rows' deviation the maps remove, per layer band, for K and V;
- the blend with the maps applied to every record read after the first chunk: full reuse and
  deviation 15% (maps from layer 2 on, so that layer 1's deviation picks the same rows), each with
  V, K or both corrected, against the same records uncorrected: KL to full prefill over its answer,
  same answer, answer F1 vs full, and answers kept of those full prefill gets right.

A map costs one [n, d] x [d + 1, d] product per layer and part for a record's n rows.
"""

from __future__ import annotations

import argparse

import torch

from runfile import RunRecord, add_common
from stale_rows import ask, bands, flat, later_chunks, stale_mask, warmed_examples

PARTS = {"K": (0,), "V": (1,), "KV": (0, 1)}


def unrotated(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Keys [heads, n, d] rotated by RoPE at the positions of ``cos``/``sin`` [n, d], back to before
    it: the model's own rotation by the opposite angles."""
    from cacheblend.blending.rope import apply_rope

    return apply_rope(keys, cos, -sin)


class Maps:
    """Per layer and part (0: K before RoPE, 1: V), the normal equations of ridge regression from
    ``[record row, 1]`` to (full prefill's row - record's), summed over the rows ``add`` is given."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.xx = [[None, None] for _ in range(layers)]
        self.xy = [[None, None] for _ in range(layers)]
        self.w: list[list[torch.Tensor]] = []

    def add(self, layer: int, part: int, record: torch.Tensor, full: torch.Tensor) -> None:
        x = torch.cat([record, torch.ones(record.shape[0], 1)], 1)
        xx, xy = x.T @ x, x.T @ (full - record)
        old = self.xx[layer][part]
        self.xx[layer][part] = xx if old is None else old + xx
        self.xy[layer][part] = xy if old is None else self.xy[layer][part] + xy

    def fit(self, ridge: float = 1e-3) -> None:
        """Solves each map, the ridge ``ridge`` x the mean of the normal matrix's diagonal."""
        self.w = []
        for layer in range(self.layers):
            row = []
            for part in (0, 1):
                xx = self.xx[layer][part]
                row.append(torch.linalg.solve(xx + ridge * xx.diagonal().mean() * torch.eye(xx.shape[0]),
                                              self.xy[layer][part]))
            self.w.append(row)

    def correction(self, layer: int, part: int, record: torch.Tensor) -> torch.Tensor:
        """The map's guess of (full - record) for rows ``record`` [n, dims]."""
        return torch.cat([record, torch.ones(record.shape[0], 1)], 1) @ self.w[layer][part]

    def apply(self, kv: torch.Tensor, parts: tuple[int, ...], first_layer: int) -> torch.Tensor:
        """A record's kv [layers, 2, heads, n, d] with ``parts`` corrected from ``first_layer`` on."""
        out = kv.clone()
        heads, n, d = kv.shape[2], kv.shape[3], kv.shape[4]
        for layer in range(first_layer, self.layers):
            for part in parts:
                rows = flat(kv[layer, part])
                fixed = rows + self.correction(layer, part, rows)
                out[layer, part] = fixed.reshape(n, heads, d).transpose(0, 1).to(kv.dtype)
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="1 development fact question to fit, 1 to measure")
    ap.add_argument("--dataset", default="facts", help="facts, pydoc or a MuSiQue-format JSON (development split)")
    ap.add_argument("--fit", type=int, default=30, help="development prompts the maps are fitted on (the first)")
    ap.add_argument("--count", type=int, default=60, help="development prompts after those, measured")
    ap.add_argument("--pool", default="run", choices=("run", "corpus"), help="where neighbours are picked (select_eval's)")
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.quick:
        args.fit, args.count, args.answer_tokens = 1, 1, 8
    record = RunRecord.start(args)
    torch.set_num_threads(args.threads)
    import select_eval as se
    from cacheblend import BlendConfig
    from cacheblend.prefilling import Prefiller
    from cacheblend.stores.record import ChunkRecord
    from cacheblend.tools.quality import token_f1

    engine, (fit_qs, eval_qs) = warmed_examples(args.model, args.dataset, args.pool,
                                                [("dev", 0, args.fit), ("dev", args.fit, args.count)])
    adapter, layers = engine.adapter, engine.adapter.num_layers
    maps = Maps(layers)

    def chunk_rows(req, kv):
        """Per chunk after the first: (its record's K/V of its rows, per layer [full K before RoPE, full V], stale mask)."""
        for plain, _, rows, own, _ in later_chunks(engine, req):
            full = []
            for layer in range(layers):
                cos, sin = adapter.rope(rows, adapter.rope_kinds[layer])
                full.append((flat(unrotated(kv[layer][0][0][:, rows].float(), cos, sin)), flat(kv[layer][1][0][:, rows])))
            mine = plain.kv[:, :, :, own]
            yield mine, full, stale_mask(full[1][1], flat(mine[1, 1]), 0.15)

    for q in fit_qs:
        req = ask(engine, q)
        for mine, full, stale in chunk_rows(req, engine.prefill(req, recompute_ratio=1.0).output.kv):
            for layer in range(layers):
                for part in (0, 1):
                    maps.add(layer, part, flat(mine[layer, part])[stale], full[layer][part][stale])
    maps.fit()

    def corrected(parts: tuple[int, ...], first_layer: int):
        def lookup(chunks, lead_from=None, lead_weight=1.0):  # the default's records, those after the first corrected
            records = engine.kv.records(chunks)
            return [r if i == 0 or r is None else ChunkRecord(r.key, maps.apply(r.kv, parts, first_layer), r.text)
                    for i, r in enumerate(records)]
        return lookup

    reuse, deviation = BlendConfig(neighbours=1, ratios=(0.0,)), BlendConfig(neighbours=1)
    methods = {"full reuse": (reuse, engine.kv.records), "deviation 15%": (deviation, engine.kv.records)}
    for label, parts in PARTS.items():
        methods[f"full reuse, {label} mapped"] = (reuse, corrected(parts, 1))
    for label, parts in PARTS.items():
        methods[f"deviation 15%, {label} mapped from layer 2"] = (deviation, corrected(parts, 2))
    rows = {m: {"kl": [], "same": [], "f1": [], "right": []} for m in methods}
    full_right, removed = [], torch.zeros(2, 2, layers)  # [part, (|D|^2, |D - guess|^2), layer]
    for i, q in enumerate(eval_qs):
        req = ask(engine, q)
        full = engine.prefill(req, recompute_ratio=1.0)
        for mine, rows_full, stale in chunk_rows(req, full.output.kv):
            for layer in range(layers):
                for part in (0, 1):
                    rec = flat(mine[layer, part])[stale]
                    dev = rows_full[layer][part][stale] - rec
                    removed[part, 0, layer] += dev.pow(2).sum()
                    removed[part, 1, layer] += (dev - maps.correction(layer, part, rec)).pow(2).sum()
        ref = engine.generate_from(full, max_new_tokens=args.answer_tokens, stop=se.STOP)
        p = torch.log_softmax(full.continuation_logits(ref.token_ids), -1)
        ends = ref.stats.finish_reason == "stop" and p[-1].argmax().item() in engine.eos_ids
        full_right.append(se._right(ref.text, q.answers))
        for name, (config, records) in methods.items():
            pre = Prefiller(adapter, engine.kv.encode, records, config).run(req)
            kl, _, same, _ = se._compare(p, pre, ref.token_ids, ends, engine.eos_ids)
            text = ref.text if same else engine.generate_from(pre, max_new_tokens=args.answer_tokens, stop=se.STOP).text
            for key, value in zip(("kl", "same", "f1", "right"), (kl, same, token_f1(text, ref.text), se._right(text, q.answers))):
                rows[name][key].append(value)
        print(f"{i + 1}/{len(eval_qs)}", flush=True)
    able = [j for j, r in enumerate(full_right) if r]
    summary = {name: {"kl": sum(r["kl"]) / len(r["kl"]), "same": sum(r["same"]), "f1": sum(r["f1"]) / len(r["f1"]),
                      "kept": sum(1 for j in able if r["right"][j]), "of": len(able)} for name, r in rows.items()}
    shares_by_band = {f"{lo}-{hi - 1}": {label: float(1 - removed[part, 1, lo:hi].sum() / removed[part, 0, lo:hi].sum())
                                         for label, part in (("K", 0), ("V", 1))} for lo, hi in bands(layers)}
    for band, shares in shares_by_band.items():
        print(f"layers {band}: held-out stale deviation removed, K {shares['K']:.3f}, V {shares['V']:.3f}")
    print("| method | KL | same answer | F1 vs full | kept |\n|---|---|---|---|---|")
    for name, s in summary.items():
        print(f"| {name} | {s['kl']:.4f} | {s['same']} of {len(eval_qs)} | {s['f1']:.3f} | {s['kept']} of {s['of']} |")
    record.write(args.run_file, {"model": args.model, "dataset": args.dataset, "layers": layers, "fit": len(fit_qs), "count": len(eval_qs),
                                 "pool": args.pool, "removed": shares_by_band, "methods": summary, "questions": rows,
                                 "full_right": full_right})


if __name__ == "__main__":
    main()
