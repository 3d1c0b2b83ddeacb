"""Exact prompts on real model families (issue 9): the engine feeds each model exactly the ids its own
tokenizer / chat template produces, reuses chunk KV inside that one tokenization, and a ratio-1.0
prefill equals a plain transformers forward of those ids.

Real tokenizers (Llama 3.1, Llama 2 / Mistral-style SentencePiece, Qwen3), vendored in
tests/data/tokenizers.tar.xz, each paired with a tiny random model of its architecture and vocabulary.
"""

import datetime

import pytest
import time_machine
import torch
from family_models import FAMILIES, MISTRAL_TEMPLATE, family_engine, family_tokenizer

from cacheblend import BlendConfig

PASSAGES = [
    "The Zorblatt Institute was founded in 1860 by Mara Quill in Vexton. It studies the tides of the northern sea.",
    "Kelpmoor Bank, founded in 1902 by Ivo Trent, is based in Dunmere; its motto is 'steady hands'.",
    "(a) The quartz mills of Ulm date from 1750 and were built by J. Roe.\nA second line follows, with more text.",
]
QUESTION = "Who founded Kelpmoor Bank?"
SYSTEM = "Answer from the passages."


def _messages(system: bool = True) -> list[dict]:
    user = "\n\n".join(PASSAGES) + "\n\n" + QUESTION
    return ([{"role": "system", "content": SYSTEM}] if system else []) + [{"role": "user", "content": user}]


def _template_ids(tokenizer, messages) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def engine(family):
    return family_engine(family)


def _hf_logits(engine, ids: list[int]) -> torch.Tensor:
    model = engine.adapter.model
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_chat_prompt_ids_are_the_templates(engine, family):
    if not engine.is_chat_model:
        pytest.skip(f"{family} is a base model (no chat template): see the plain-prompt test")
    messages = _messages(system=family != "mistral")
    expected = _template_ids(engine.tokenizer, messages)
    assert engine.token_ids(engine.render_chat(messages)) == expected
    bos = engine.tokenizer.bos_token_id
    if bos is not None:
        assert expected.count(bos) == 1


def test_explicit_chunks_ids_are_the_templates(engine, family):
    """chunks/query/prefix build the documented prompt; its ids are the template's (or tokenizer's)."""
    ids = engine.request(chunks=PASSAGES, query=QUESTION, prefix=SYSTEM).ids
    tok = engine.tokenizer
    if engine.is_chat_model:
        if family == "mistral":  # no system role: the prefix opens the user message
            user = SYSTEM + "\n\n" + "\n\n".join(PASSAGES) + "\n\n" + QUESTION
            expected = _template_ids(tok, [{"role": "user", "content": user}])
        else:
            expected = _template_ids(tok, _messages())
    else:
        expected = tok(SYSTEM + "\n\n" + "\n\n".join(PASSAGES) + "\n\n" + QUESTION)["input_ids"]
    assert ids == list(expected)


def test_plain_prompt_ids_are_the_tokenizers(engine):
    prompt = "Context:\n" + "\n\n".join(PASSAGES) + "\nQuestion: " + QUESTION + "\nAnswer:"
    assert engine.token_ids(prompt) == list(engine.tokenizer(prompt)["input_ids"])


@pytest.mark.parametrize("chat", [True, False])
def test_full_prefill_equals_transformers_forward(engine, family, chat):
    """ratio 1.0 == a plain HF forward of the tokenizer's ids, with the chunks warmed or not."""
    engine.warm(PASSAGES)
    if chat and engine.is_chat_model:
        prompt = engine.render_chat(_messages(system=family != "mistral"))
    else:
        prompt = "Context:\n" + "\n\n".join(PASSAGES) + "\nQuestion: " + QUESTION + "\nAnswer:"
    ids = engine.token_ids(prompt)
    pre = engine.prefill(prompt, recompute_ratio=1.0)
    assert pre.ids.tolist() == ids
    torch.testing.assert_close(pre.output.logits.float(), _hf_logits(engine, ids), atol=2e-5, rtol=1e-5)


def test_blend_reuses_chunk_kv_inside_the_one_tokenization(engine, family):
    engine.warm(PASSAGES)
    prompt = "Context:\n" + "\n\n".join(reversed(PASSAGES)) + "\nQuestion: " + QUESTION + "\nAnswer:"
    pre = engine.prefill(prompt, recompute_ratio=0.15)
    assert pre.ids.tolist() == list(engine.tokenizer(prompt)["input_ids"])
    assert pre.stats.chunk_hits == 3 and pre.stats.chunk_misses == 0
    assert _tokens_not_reused(engine, pre) == _expected_not_reused(engine)


def _tokens_not_reused(engine, pre) -> int:
    """Warmed chunk tokens whose cached KV the prefill ``pre`` did not use."""
    return sum(len(engine.kv.encode(p).ids) for p in PASSAGES) - pre.stats.hit_tokens


def _expected_not_reused(engine) -> int:
    """What README's exact-prompts table claims (99.5-100% reused): every warmed token is reused
    except, on byte-level BPE vocabularies, a chunk's final period, which merges with the line
    break after it into one token (``.\n``) and is recomputed. Every passage here ends with a
    period and is followed by a line break. Measured: 3 of 90 (Llama 3.1), 3 of 96 (Qwen3),
    0 of 106 (Llama 2, Mistral) on every prompt of this file."""
    merges = len(engine.tokenizer(".\n", add_special_tokens=False)["input_ids"]) == 1
    return len(PASSAGES) if merges else 0


def _not_reused(engine, prompt: str) -> int:
    engine.warm(PASSAGES)
    pre = engine.prefill(prompt, recompute_ratio=0.15)
    assert pre.stats.chunk_hits == len(PASSAGES)
    return _tokens_not_reused(engine, pre)


def test_langchain_stuff_prompt_reuses_chunk_tokens(engine):
    from langchain_classic.chains.retrieval_qa.prompt import PROMPT

    context = "\n\n".join(PASSAGES)  # create_stuff_documents_chain's default separator
    prompt = PROMPT.format(context=context, question=QUESTION)
    if engine.is_chat_model:
        prompt = engine.render_chat([{"role": "user", "content": prompt}])
    assert _not_reused(engine, prompt) == _expected_not_reused(engine)


def test_llama_index_qa_prompt_reuses_chunk_tokens(engine):
    from llama_index.core.prompts.default_prompts import DEFAULT_TEXT_QA_PROMPT_TMPL

    prompt = DEFAULT_TEXT_QA_PROMPT_TMPL.format(context_str="\n\n".join(PASSAGES), query_str=QUESTION)
    if engine.is_chat_model:
        prompt = engine.render_chat([{"role": "user", "content": prompt}])
    assert _not_reused(engine, prompt) == _expected_not_reused(engine)


DATED_TEMPLATE = (
    "{{ bos_token }}{% if not date_string is defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nToday Date: {{ date_string }}\n\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}<|eot_id|>"
    "{% for m in messages %}{% if m['role'] != 'system' %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
STRFTIME_TEMPLATE = DATED_TEMPLATE.replace(
    "{% if not date_string is defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif %}", ""
).replace("{{ date_string }}", "{{ strftime_now('%Y-%m-%d') }}")


@pytest.mark.parametrize("template", [DATED_TEMPLATE, STRFTIME_TEMPLATE], ids=["date_string", "strftime_now"])
def test_fingerprint_does_not_change_with_the_date(template):
    """A template that writes today's date into the system header must not change chunk keys."""
    prints, renders = [], []
    for day in (datetime.datetime(2026, 1, 5, 12), datetime.datetime(2026, 7, 9, 12)):
        with time_machine.travel(day, tick=False):
            engine = family_engine("llama3_1", chat_template=template)
            prints.append(engine.kv.fingerprint)
            renders.append(engine.render_chat([{"role": "user", "content": "hi"}]))
    assert renders[0] != renders[1]  # the template does depend on the date
    assert prints[0] == prints[1]


def test_mistral_template_has_no_system_role():
    """The reference Mistral template refuses a system message; the engine folds the prefix in."""
    tok = family_tokenizer("mistral")
    assert tok.chat_template == MISTRAL_TEMPLATE
    with pytest.raises(Exception):
        tok.apply_chat_template(_messages(system=True), tokenize=False)
