"""The official openai client (sync, async, streaming) against a real server on loopback."""

import asyncio
from dataclasses import replace

import httpx
import openai
import pytest
from live_server import TINY, health, metric, running, wait_for

from cacheblend.serving.app import SchedulerLimits

PASSAGES = [
    "The lighthouse keeper of Orlen island logs every passing ship in a blue leather book each night.",
    "Orlen island has no trees; its only freshwater spring was dug by the monks of Saint Aubrel in 1411.",
    "Ships bound for the northern ports must signal the Orlen lighthouse twice before passing the reef.",
]


@pytest.fixture(scope="module")
def client(tiny_url):
    return openai.OpenAI(base_url=tiny_url, api_key="unused", max_retries=0)


def _chat(client, content, **kw):
    kw.setdefault("max_tokens", 12)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": content}], **kw)


def test_chat_answer_equals_the_engines_generation(client, tiny_engine):
    """The batched server path gives the engine's own (HF-model) decoding, token for token."""
    out = _chat(client, "Name three colours of the sea.", max_tokens=16)
    prompt = tiny_engine.render_chat([{"role": "user", "content": "Name three colours of the sea."}])
    want = tiny_engine.generate(prompt, max_new_tokens=16)
    assert out.choices[0].message.content == want.text
    assert out.choices[0].message.role == "assistant" and out.object == "chat.completion"
    assert out.usage.prompt_tokens == want.stats.prompt_tokens
    assert out.usage.completion_tokens == want.stats.completion_tokens
    assert out.choices[0].finish_reason == want.stats.finish_reason


def test_stream_concatenates_to_the_non_streamed_answer_with_usage(client):
    whole = _chat(client, "Describe a harbour at dawn.", max_completion_tokens=20)
    stream = _chat(client, "Describe a harbour at dawn.", max_completion_tokens=20, stream=True,
                   stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.completion_tokens <= 20


def test_async_client_and_text_completions(tiny_url):
    async def run():
        client = openai.AsyncOpenAI(base_url=tiny_url, api_key="unused", max_retries=0)
        whole = await client.completions.create(model=TINY, prompt="Once upon a time", max_tokens=10, temperature=0)
        stream = await client.completions.create(model=TINY, prompt="Once upon a time", max_tokens=10,
                                                 temperature=0, stream=True)
        pieces = [c.choices[0].text async for c in stream]
        return whole, "".join(pieces)

    whole, streamed = asyncio.run(run())
    assert whole.object == "text_completion" and whole.choices[0].text == streamed
    assert whole.usage.completion_tokens == 10 and whole.choices[0].finish_reason == "length"


def test_seed_makes_sampling_reproducible(client):
    a, b, c = (_chat(client, "Invent a word.", temperature=1.0, seed=s, max_tokens=12) for s in (7, 7, 8))
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content != c.choices[0].message.content


def test_stop_string_ends_the_answer(client):
    free = _chat(client, "Count slowly.", max_tokens=24).choices[0].message.content
    cut = free[3:6]  # a stop string that occurs in the free answer
    stopped = _chat(client, "Count slowly.", max_tokens=24, stop=[cut, "never-there"])
    assert stopped.choices[0].message.content == free[: free.find(cut)]
    assert stopped.choices[0].finish_reason == "stop"


def test_documents_are_warmed_after_their_first_use_off_its_path_and_reused_in_any_order(client, tiny_url, tiny_engine):
    """Warm on miss: the first request computes its unseen documents inside the prompt (three
    misses, nothing cached, nothing warmed before it); the idle model thread then warms them, and
    the next request reads all three in another order."""
    hits, warmed = metric(tiny_url, "chunk_hits_total"), metric(tiny_url, "warm_on_miss_warmed")
    docs = [{"title": f"Orlen {i}", "text": t} for i, t in enumerate(PASSAGES)]
    first = _chat(client, "Who dug the spring?", extra_body={"documents": docs})
    assert first.usage.cacheblend["chunk_misses"] == 3 and first.usage.cacheblend["chunk_hits"] == 0
    assert first.usage.prompt_tokens_details.cached_tokens == first.usage.cacheblend["head_tokens"]  # at most its head
    wait_for(lambda: metric(tiny_url, "warm_on_miss_warmed") >= warmed + 3 and metric(tiny_url, "warm_on_miss_queued") == 0)
    second = _chat(client, "Who dug the spring?", extra_body={"documents": docs[::-1]})
    assert second.usage.cacheblend["chunk_hits"] == 3 and second.usage.cacheblend["chunk_misses"] == 0
    doc_tokens = second.usage.cacheblend["chunk_tokens"]
    assert second.usage.prompt_tokens_details.cached_tokens >= 0.8 * doc_tokens > 0
    full = _chat(client, "Who dug the spring?", extra_body={"documents": docs[::-1], "recompute_ratio": 1.0})
    assert full.usage.prompt_tokens_details.cached_tokens == 0 and full.usage.cacheblend["recompute_ratio"] == 1.0
    assert second.usage.cacheblend["budget_signal"] is None  # a fixed ratio
    assert second.usage.cacheblend["draft_margin"] is None  # deviation drafts nothing
    auto = _chat(client, "Who dug the spring?", extra_body={"documents": docs, "recompute_ratio": "auto"})
    cfg, use = tiny_engine.config, auto.usage.cacheblend
    assert use["chunk_hits"] == 3 and use["budget_signal"] is not None
    assert cfg.auto_min_ratio <= use["recompute_ratio"] <= cfg.auto_max_ratio  # the adaptive budget chose it
    assert metric(tiny_url, "chunk_hits_total") == hits + 6
    assert metric(tiny_url, "warm_on_miss_warmed") == warmed + 3  # each warmed once, none again


def test_without_warm_on_miss_documents_are_warmed_before_the_prefill(tiny_engine):
    docs = [{"title": "Orlen", "text": t + " (kept warm first)"} for t in PASSAGES]
    with running(tiny_engine, model_names=[TINY], limits=SchedulerLimits(warm_on_miss=False)) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        first = _chat(c, "Who dug the spring?", extra_body={"documents": docs})
        assert first.usage.cacheblend["chunk_hits"] == 3 and first.usage.prompt_tokens_details.cached_tokens > 0
        text = httpx.get(url.removesuffix("/v1") + "/metrics").text
        assert "warm_on_miss_queued" not in text


def test_documents_endpoint_warms_texts_found_later_in_plain_messages(client, tiny_url):
    text = "The Vell glacier retreats about forty metres every summer, exposing grey moraine ridges."
    base = tiny_url.removesuffix("/v1")
    first = httpx.post(f"{base}/v1/documents", json={"documents": [text]}).json()
    again = httpx.post(f"{base}/v1/documents", json={"documents": [{"text": text, "title": "Vell"}]}).json()
    assert first["warmed"] == 1 and first["data"][0]["cached"] is False
    assert again["warmed"] == 0 and again["data"][0]["id"] == first["data"][0]["id"]
    out = _chat(client, f"Read this.\n\n{text}\n\nHow fast does the glacier retreat?")
    assert out.usage.cacheblend["chunk_hits"] == 1 and out.usage.prompt_tokens_details.cached_tokens > 0


def test_models_health_and_metrics(client, tiny_url):
    assert [m.id for m in client.models.list()] == [TINY]
    assert health(tiny_url)["status"] == "ok"
    before = metric(tiny_url, "requests_total")
    _chat(client, "hello")
    assert metric(tiny_url, "requests_total") == before + 1
    assert metric(tiny_url, "time_to_first_token_seconds_count") >= 1
    text = httpx.get(tiny_url.removesuffix("/v1") + "/metrics").text
    for name in ("queue_depth", "store_memory_bytes", "prompt_tokens_reused_total", "chunk_misses_total"):
        assert f"# TYPE cacheblend_{name}" in text


def test_a_draft_selectors_answers_are_greedy_decodings_with_the_draft_verified(tiny_model_dir):
    """A server whose engine drafts (``selector="draft"``): streamed or not, its temperature-0 answer
    is the tokens the same prefill decodes without its draft (in this process), and it reports the
    answer tokens one forward verified from the draft, as in-process decoding counts them."""
    from cacheblend import BlendConfig, BlendEngine

    engine = BlendEngine.from_pretrained(tiny_model_dir, device="cpu", config=BlendConfig(selector="draft", draft_tokens=6))
    engine.warm(PASSAGES)
    content = "\n\n".join(PASSAGES) + "\n\nWho dug the spring?"
    pre = engine.prefill(engine.render_chat([{"role": "user", "content": content}]))
    assert pre.stats.chunk_hits == 3 and len(pre.output.draft) == 6
    want = engine.generate_from(pre, max_new_tokens=12)
    plain = engine.generate_from(replace(pre, output=replace(pre.output, draft=[])), max_new_tokens=12)
    assert want.token_ids == plain.token_ids and want.stats.draft_verified > 0 == plain.stats.draft_verified
    with running(engine, model_names=[TINY]) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        whole = _chat(client, content)
        chunks = list(_chat(client, content, stream=True, stream_options={"include_usage": True}))
    assert whole.choices[0].message.content == plain.text
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.text
    assert whole.usage.cacheblend["draft_verified"] == chunks[-1].usage.cacheblend["draft_verified"] == want.stats.draft_verified
    assert whole.usage.completion_tokens == len(plain.token_ids)
