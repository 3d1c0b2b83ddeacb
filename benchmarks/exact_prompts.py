"""Exact prompts on real model families: are the engine's ids the tokenizer's, and how much of each
chunk's KV is reused inside the one tokenization? (issue 9)

    python benchmarks/exact_prompts.py [--model M] [--run-file docs/runs/exact_prompts.json]
    python benchmarks/exact_prompts.py --quick    # one tiny family and the real model, 2 short passages
    python benchmarks/exact_prompts.py --musique ../shared/data/musique_s.json   # old vs new ids

For each family (real tokenizers vendored in tests/data, a tiny random model of the architecture;
and the real model of ``--model``, by default the bundled SmolLM2):
"ids identical" compares the engine's ids with ``apply_chat_template(tokenize=True)`` (chat path),
with the template over the documented explicit-chunks messages, and with ``tokenizer(prompt)``
(plain prompt); "reused" is the share of the passages' warmed tokens whose cached KV a blend
reuses on LangChain's RetrievalQA prompt (chunks joined by blank lines after "\\n\\n") and on
LlamaIndex's default text-QA prompt, each wrapped in the chat template where the family has one.
Passages: 6 pydoc passages of up to 256 tokens.
"""

import argparse
import os
import sys
from pathlib import Path

from runfile import RunRecord, add_common

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

QUESTION = "What does the statement do?"


def _template_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _identical(engine, passages: list[str]) -> dict[str, bool]:
    tok, user = engine.tokenizer, "\n\n".join(passages) + "\n\n" + QUESTION
    plain = "Context:\n" + user + "\nAnswer:"
    out = {"plain prompt": engine.token_ids(plain) == list(tok(plain)["input_ids"])}
    if engine.is_chat_model:
        messages = [{"role": "user", "content": user}]
        out["chat template"] = engine.token_ids(engine.render_chat(messages)) == _template_ids(tok, messages)
        out["explicit chunks"] = engine.request(chunks=passages, query=QUESTION).ids == _template_ids(tok, messages)
    return out


def _reused(engine, passages: list[str], prompt: str) -> float:
    if engine.is_chat_model:
        prompt = engine.render_chat([{"role": "user", "content": prompt}])
    pre = engine.prefill(prompt, recompute_ratio=0.15)
    return pre.stats.hit_tokens / sum(len(engine.kv.encode(p).ids) for p in passages)


def segmentwise_ids(tokenizer, text) -> list[int]:
    """The old (before issue 9) way: template text, each chunk and each separator tokenized apart."""
    ids, at = [], 0
    for span in text.chunks:
        for piece in (text.text[at : span.start], span.text):
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []
        at = span.end
    return ids + tokenizer(text.text[at:], add_special_tokens=False)["input_ids"]


def musique_check(path: str, model: str) -> dict:
    """How many MuSiQue prompts the old segment-wise tokenization fed the model differently."""
    from cacheblend import shared_engine
    from cacheblend.tools.bench import QA_PREFIX
    from cacheblend.tools.datasets import load_musique

    engine = shared_engine(model)
    data = load_musique(path, 6)
    differ = 0
    for ex in data:
        text = engine.request(chunks=ex.passages, query=ex.question, prefix=QA_PREFIX).text
        differ += segmentwise_ids(engine.tokenizer, text) != engine.token_ids(text.text)
    print(f"MuSiQue prompts whose segment-wise ids differ from the tokenizer's: {differ} of {len(data)}")
    return {"musique": path, "prompts": len(data), "segmentwise_differ": differ}


def family_row(engine, label: str, passages: list[str]) -> dict:
    """One table row: ids identical per path, and the share reused on the two frameworks' prompts."""
    from langchain_classic.chains.retrieval_qa.prompt import PROMPT
    from llama_index.core.prompts.default_prompts import DEFAULT_TEXT_QA_PROMPT_TMPL

    engine.warm(passages, progress=False)
    context = "\n\n".join(passages)
    return {
        "family": label, "identical": _identical(engine, passages),
        "reused_langchain": _reused(engine, passages, PROMPT.format(context=context, question=QUESTION)),
        "reused_llamaindex": _reused(engine, passages, DEFAULT_TEXT_QA_PROMPT_TMPL.format(context_str=context, query_str=QUESTION)),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="the llama3_1 tiny model and the real model, 2 passages of up to 64 tokens")
    ap.add_argument("--families", default="all", help="tiny random families of tests/family_models.py, comma-separated ('' for none)")
    ap.add_argument("--passages", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=256, help="passage length limit")
    ap.add_argument("--musique", default=None, metavar="JSON", help="only count MuSiQue prompts the old tokenization changed")
    args = ap.parse_args(argv)
    if args.quick:
        args.families, args.passages, args.max_tokens = "llama3_1", 2, 64
    record = RunRecord.start(args)
    if args.musique:
        record.write(args.run_file, musique_check(args.musique, args.model))
        return
    from family_models import FAMILIES, family_engine

    families = FAMILIES if args.families == "all" else [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")

    from cacheblend import shared_engine
    from cacheblend.tools.datasets import pydoc_passages

    print("| family | ids identical (paths) | reused, LangChain RetrievalQA | reused, LlamaIndex text QA |")
    print("|---|---|---|---|")
    rows = []
    for family in [*families, None]:
        engine = shared_engine(args.model) if family is None else family_engine(family)
        passages = [p.text for p in pydoc_passages(engine.count_tokens, max_tokens=args.max_tokens)[40 : 40 + args.passages]]
        rows.append(family_row(engine, family or f"{args.model} (real)", passages))
        r = rows[-1]
        paths = ", ".join(f"{k}: {'identical' if v else 'DIFFERENT'}" for k, v in r["identical"].items())
        print(f"| {r['family']} | {paths} | {r['reused_langchain']:.1%} | {r['reused_llamaindex']:.1%} |", flush=True)
    record.write(args.run_file, {"passages": args.passages, "max_tokens": args.max_tokens, "rows": rows})


if __name__ == "__main__":
    main()
