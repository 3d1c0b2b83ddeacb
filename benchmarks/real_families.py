"""The family table on real weights: exactness, chunk reuse and blend quality per real model.

    .venv/bin/python benchmarks/real_families.py [--model M ...] [--run-file docs/runs/real_families.json]
    .venv/bin/python benchmarks/real_families.py --quick --model PATH   # 1 prompt, 4 answer tokens

For each model (default: the three catalogue aliases), the six fictional-fact passages of
tests/core/facts.py are warmed in one call on a fresh engine (default warming), then asked over in
three chunk orders, one question each (~700-800-token prompts, past Gemma 3's 512-token window):
- ``max_abs_logit_diff``: ratio 1.0 against a plain transformers forward of the same ids (fp32);
- ``reused``: the share of chunk tokens whose cached KV the default blend reads;
- ``kl_blend`` / ``kl_reuse``: mean KL(full prefill || x) along the full prefill's answer, for the
  default blend (15%) and for full reuse of the same records (ratio 0.0, the same engine and store);
- ``right``: answers containing the gold fact, for plain transformers greedy decoding, the engine's
  full prefill, the default blend and full reuse.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from runfile import RunRecord, add_common

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))

from facts import correct, passage, question  # noqa: E402

MODELS = ("smollm2-135m-instruct", "qwen2.5-0.5b-instruct", "gemma3-270m")
GROUP = list(range(6))
ORDERS = [GROUP, GROUP[::-1], [3, 0, 5, 1, 4, 2]]
QUESTIONS = [1, 4, 2]


def measure(model: str, prompts: int, answer_tokens: int) -> dict:
    import torch

    from cacheblend import BlendEngine
    from cacheblend.tools.quality import answer_kl

    engine = BlendEngine.from_pretrained(model)
    engine.warm([passage(i) for i in GROUP])
    rows = []
    for order, q in list(zip(ORDERS, QUESTIONS))[:prompts]:
        text, answers = question(q)
        req = dict(chunks=[passage(i) for i in order], query=text)
        full = engine.prefill(**req, recompute_ratio=1.0)
        with torch.inference_mode():
            ref = engine.adapter.model(input_ids=full.ids[None]).logits[0, -1].float()
            plain = engine.adapter.model.generate(full.ids[None], max_new_tokens=answer_tokens, do_sample=False)
        plain_text = engine.tokenizer.decode(plain[0, full.ids.shape[0]:], skip_special_tokens=True)
        answer = engine.generate_from(full, max_new_tokens=answer_tokens)
        blend, reuse = engine.prefill(**req), engine.prefill(**req, recompute_ratio=0.0)
        texts = {"transformers": plain_text, "full prefill": answer.text,
                 "blend": engine.generate_from(blend, max_new_tokens=answer_tokens).text,
                 "full reuse": engine.generate_from(reuse, max_new_tokens=answer_tokens).text}
        chunk_tokens = sum(len(engine.kv.encode(p).ids) for p in req["chunks"])
        rows.append({
            "question": q, "prompt_tokens": int(full.ids.shape[0]), "chunk_hits": blend.stats.chunk_hits,
            "max_abs_logit_diff": float((full.output.logits.float() - ref).abs().max()),
            "max_abs_logit": float(ref.abs().max()),
            "reused": blend.stats.hit_tokens / chunk_tokens,
            "kl_blend": answer_kl(full, blend, answer.token_ids), "kl_reuse": answer_kl(full, reuse, answer.token_ids),
            "answers": texts, "right": {k: correct(v, answers) for k, v in texts.items()},
        })
        print(model, rows[-1], flush=True)
    summary = {
        "prompts": len(rows),
        "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in rows),
        "reused": min(r["reused"] for r in rows),
        "kl_blend": statistics.mean(r["kl_blend"] for r in rows),
        "kl_reuse": statistics.mean(r["kl_reuse"] for r in rows),
        "right": {k: sum(r["right"][k] for r in rows) for k in rows[0]["right"]},
    }
    return {"summary": summary, "rows": rows, "family": engine.adapter.config.model_type}


def table(results: dict) -> str:
    lines = ["| model | family | max abs logit diff at ratio 1.0 | chunk tokens reused | KL blend 15% | KL full reuse (same records) | right: transformers / full / blend / reuse |",
             "|---|---|---|---|---|---|---|"]
    for model, res in results.items():
        s = res["summary"]
        right = " / ".join(str(s["right"][k]) for k in ("transformers", "full prefill", "blend", "full reuse"))
        lines.append(f"| {model} | {res['family']} | {s['max_abs_logit_diff']:.1e} | {s['reused']:.1%} | "
                     f"{s['kl_blend']:.4f} | {s['kl_reuse']:.4f} | {right} of {s['prompts']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(parser, quick="one prompt, 4 answer tokens")
    parser.set_defaults(model=None)
    parser.add_argument("--also", action="append", default=[], metavar="M", help="another model to measure (repeatable)")
    args = parser.parse_args()
    models = [args.model, *args.also] if args.model else list(MODELS)
    record = RunRecord.start(args)
    prompts, answer_tokens = (1, 4) if args.quick else (len(ORDERS), 12)
    results = {m: measure(m, prompts, answer_tokens) for m in models}
    print(table(results))
    record.write(args.run_file, {"models": results, "table": table(results)})


if __name__ == "__main__":
    main()
