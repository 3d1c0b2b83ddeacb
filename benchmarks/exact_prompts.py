"""Exact prompts on real model families: are the engine's ids the tokenizer's, and how much of each
chunk's KV is reused inside the one tokenization? (issue 9)

    python benchmarks/exact_prompts.py            # prints a markdown table
    python benchmarks/exact_prompts.py --musique ../shared/data/musique_s.json   # old vs new ids

For each family (real tokenizers vendored in tests/data, a tiny random model of the architecture;
and the bundled SmolLM2 model itself):
"ids identical" compares the engine's ids with ``apply_chat_template(tokenize=True)`` (chat path),
with the template over the documented explicit-chunks messages, and with ``tokenizer(prompt)``
(plain prompt); "reused" is the share of the passages' warmed tokens whose cached KV a blend
reuses on LangChain's RetrievalQA prompt (chunks joined by blank lines after "\\n\\n") and on
LlamaIndex's default text-QA prompt, each wrapped in the chat template where the family has one.
Passages: 6 pydoc passages of up to 256 tokens.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from family_models import FAMILIES, family_engine  # noqa: E402

from cacheblend.tools.datasets import pydoc_passages  # noqa: E402

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
        out["explicit chunks"] = engine.token_ids(chunks=passages, query=QUESTION) == _template_ids(tok, messages)
    return out


def _reused(engine, passages: list[str], prompt: str) -> float:
    if engine.is_chat_model:
        prompt = engine.render_chat([{"role": "user", "content": prompt}])
    pre = engine.prefill(prompt, recompute_ratio=0.15)
    return pre.stats.cached_tokens / sum(len(engine.encode_chunk(p).ids) for p in passages)


def segmentwise_ids(tokenizer, text) -> list[int]:
    """The old (before issue 9) way: template text, each chunk and each separator tokenized apart."""
    ids, at = [], 0
    for span in text.chunks:
        for piece in (text.text[at : span.start], span.text):
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []
        at = span.end
    return ids + tokenizer(text.text[at:], add_special_tokens=False)["input_ids"]


def musique_check(path: str) -> None:
    """How many bundled-model MuSiQue prompts the old segment-wise tokenization fed differently."""
    from cacheblend import shared_engine
    from cacheblend.tools.bench import QA_PREFIX
    from cacheblend.tools.datasets import load_musique

    engine = shared_engine()
    data = load_musique(path, 6)
    differ = 0
    for ex in data:
        text = engine.prompt_text(chunks=ex.passages, query=ex.question, prefix=QA_PREFIX)
        differ += segmentwise_ids(engine.tokenizer, text) != engine.token_ids(text.text)
    print(f"MuSiQue prompts whose segment-wise ids differ from the tokenizer's: {differ} of {len(data)}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--musique":
        return musique_check(sys.argv[2])
    from langchain_classic.chains.retrieval_qa.prompt import PROMPT
    from llama_index.core.prompts.default_prompts import DEFAULT_TEXT_QA_PROMPT_TMPL

    print("| family | ids identical (paths) | reused, LangChain RetrievalQA | reused, LlamaIndex text QA |")
    print("|---|---|---|---|")
    from cacheblend import shared_engine

    for family in [*FAMILIES, "smollm2 (bundled, real)"]:
        engine = shared_engine() if family.startswith("smollm2") else family_engine(family)
        passages = [p.text for p in pydoc_passages(engine.count_tokens, max_tokens=256)[40:46]]
        engine.warm(passages)
        same = _identical(engine, passages)
        context = "\n\n".join(passages)
        lc = _reused(engine, passages, PROMPT.format(context=context, question=QUESTION))
        li = _reused(engine, passages, DEFAULT_TEXT_QA_PROMPT_TMPL.format(context_str=context, query_str=QUESTION))
        paths = ", ".join(f"{k}: {'identical' if v else 'DIFFERENT'}" for k, v in same.items())
        print(f"| {family} | {paths} | {lc:.1%} | {li:.1%} |")


if __name__ == "__main__":
    main()
