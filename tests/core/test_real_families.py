"""Real weights beyond the bundled model: Qwen2.5-Coder-0.5B-Instruct (qwen2, chat template) and
Gemma 3 270M (gemma3_text, base: two RoPE bases, a 512-token sliding window on 5 of 6 layers).

On fictional-fact prompts of six passages (~800 tokens, so Gemma's window is crossed inside the
chunks and across their boundaries), each model must:
- at ratio 1.0 give a plain transformers forward's logits on the tokenizer's own ids;
- hit every warmed chunk and reuse its tokens;
- with the default blend, be closer to full prefill than full reuse of the same records (the same
  engine and store at ratio 0.0, so both read exactly the KV the blend reads).
Each model's engine is the process-wide one the integration classes load for its alias (no other
test uses these aliases), warmed in one call, so its KV does not depend on other tests.
"""

import statistics

import pytest
import torch
from facts import passage, question

from cacheblend import shared_engine
from cacheblend.tools.quality import answer_kls

pytestmark = pytest.mark.real_model

MODELS = {"qwen2.5-0.5b-instruct": "qwen_dir", "gemma3-270m": "gemma_dir"}
GROUP = list(range(6))  # six fact passages
ORDERS = [GROUP, GROUP[::-1], [3, 0, 5, 1, 4, 2]]
QUESTIONS = [1, 4, 2]  # one question per order, its passage at a different place each time
ANSWER = 12
# Measured with ``python benchmarks/real_families.py`` (docs/runs/real_families.json), fp32 CPU:
# max |logit diff| at ratio 1.0 9.6e-6 (Qwen, logits up to 20) and 1.7e-5 (Gemma, up to 23): fp32
# round-off (eps 1.2e-7 x |logit| 20 is 2.4e-6 per op, over 18-24 layers); a wrong RoPE table or
# mask moves logits by whole units. KL(full || x), blend / full reuse of the same records, per order:
# Qwen 0.0069/0.0115, 0.0040/0.0051, 0.0072/0.0087 (mean ratio 0.71, worst order 0.83);
# Gemma 0.049/0.068, 0.143/0.144, 0.089/0.115 (mean ratio 0.86, worst order 0.996). The runs are
# deterministic (fixed prompts, fp32), so each margin sits just above its measured mean ratio.
ATOL = 1e-4
MARGIN = {"qwen2.5-0.5b-instruct": 0.8, "gemma3-270m": 0.95}


@pytest.fixture(scope="module", params=list(MODELS))
def engine(request):
    request.getfixturevalue(MODELS[request.param])  # assembled and converted once per session
    engine = shared_engine(request.param)
    engine.warm([passage(i) for i in GROUP])
    return engine


@pytest.fixture(scope="module")
def full_prefills(engine):
    """(request, full prefill) for each order: the reference every test compares with."""
    return [(req, engine.prefill(**req, recompute_ratio=1.0)) for req in map(_request, ORDERS, QUESTIONS)]


def _request(order, q):
    return dict(chunks=[passage(i) for i in order], query=question(q)[0])


@torch.inference_mode()
def _hf_logits(engine, ids: torch.Tensor) -> torch.Tensor:
    return engine.adapter.model(input_ids=ids[None]).logits[0, -1].float()


def test_full_prefill_equals_transformers_forward(engine, full_prefills):
    """ratio 1.0 == a plain HF forward of the tokenizer's ids (every chunk is warmed; at ratio 1.0 the
    engine computes every row, so it reads none of them). The tolerance
    is fp32 round-off (see ATOL): the same ops in other kernels' summation orders."""
    for req, pre in full_prefills:
        assert pre.ids.tolist() == engine.token_ids(engine.request(**req).text.text)
        ref = _hf_logits(engine, pre.ids)
        torch.testing.assert_close(pre.output.logits.float(), ref, atol=ATOL, rtol=1e-5)
        assert int(pre.output.logits.argmax()) == int(ref.argmax())


def test_every_warmed_chunk_hits(engine):
    pre = engine.prefill(**_request(ORDERS[1], QUESTIONS[1]))
    chunk_tokens = sum(len(engine.kv.encode(passage(i)).ids) for i in GROUP)
    assert pre.stats.chunk_hits == 6 and pre.stats.chunk_misses == 0
    assert pre.stats.hit_tokens >= chunk_tokens - 6  # at most one edge token per chunk recomputed
    assert pre.stats.recomputed_tokens < pre.stats.prompt_tokens  # a blend, not a full prefill


def test_default_blend_is_closer_to_full_prefill_than_full_reuse_of_the_same_records(engine, full_prefills):
    """Mean KL to full prefill over three orders: the default blend (15%) against full reuse of the
    records it reads, with the margin of MARGIN."""
    kl = {"blend": [], "reuse": []}
    answers = engine.generate_many([full for _, full in full_prefills], max_new_tokens=ANSWER)  # decoded together
    for (req, full), answer in zip(full_prefills, (a.token_ids for a in answers)):
        blend, reuse = engine.prefill(**req), engine.prefill(**req, recompute_ratio=0.0)
        assert blend.stats.chunk_hits == reuse.stats.chunk_hits == 6
        assert blend.stats.hit_tokens == reuse.stats.hit_tokens  # the same records
        for name, value in zip(("blend", "reuse"), answer_kls(full, [blend, reuse], answer)):
            kl[name].append(value)
    mean = {k: statistics.mean(v) for k, v in kl.items()}
    assert mean["blend"] < MARGIN[engine.name] * mean["reuse"], kl


def test_langchain_llamaindex_and_the_server_reuse_the_chunks(engine):
    """Every path over the same model: LangChain's and LlamaIndex's LLM classes and the OpenAI
    server answer a raw prompt holding the warmed passages exactly as the engine does (temperature
    0), each reusing all six chunks."""
    import openai
    from live_server import running
    from llama_index_cacheblend import CacheBlendLLM as LlamaIndexLLM
    from llama_index_cacheblend import blend_stats

    from langchain_cacheblend import CacheBlendLLM as LangChainLLM

    alias = engine.name  # model=alias in the integration classes is this very engine
    q, _ = question(QUESTIONS[0])
    prompt = "Context:\n" + "\n\n".join(passage(i) for i in ORDERS[2]) + f"\nQuestion: {q}\nAnswer:"
    expected = engine.generate(prompt, max_new_tokens=8)
    assert expected.stats.chunk_hits == 6

    lc = LangChainLLM(model=alias, max_tokens=8, apply_chat_template=False).generate([prompt]).generations[0][0]
    assert lc.text == expected.text and lc.generation_info["blend_stats"]["chunk_hits"] == 6

    li = LlamaIndexLLM(model=alias, max_new_tokens=8).complete(prompt, formatted=True)
    assert li.text == expected.text and blend_stats(li).chunk_hits == 6

    with running(engine) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        out = client.completions.create(model=alias, prompt=prompt, max_tokens=8, temperature=0)
    assert out.choices[0].text == expected.text
    read = out.usage.prompt_tokens_details.cached_tokens - out.usage.cacheblend["head_tokens"]  # OpenAI's: reused
    assert read == expected.stats.reused_tokens - expected.stats.head_tokens > 0  # (the head: once it is cached)
