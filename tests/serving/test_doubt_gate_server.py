"""The doubt gate in the server: a request in doubt is prefilled again on the model thread and its
slot's KV replaced mid-batch; its answer over HTTP is the library's, token for token, alone or
decoded beside others, and /metrics counts the redos."""

import statistics
from concurrent.futures import ThreadPoolExecutor

import openai
from live_server import TINY, metric, running

from cacheblend import BlendConfig, BlendEngine
from cacheblend.generation.doubt import top_margin

CHUNKS = [
    "The well at Dunmarrow was dug by a shepherd called Ivo in a dry summer.",
    "Korrin Bay's fishermen land mackerel at dawn and sell it before noon.",
    "Ashgrove's school was founded by Helena Brisk with money from a wool fair.",
]
QUESTIONS = [f"Question {i}: who or what is named in passage {i % 3 + 1}?" for i in range(8)]
TOKENS = 10


def _engine(tiny_engine, **config) -> BlendEngine:
    engine = BlendEngine(tiny_engine.adapter.model, tiny_engine.tokenizer, config=BlendConfig(ratios=(0.0,), **config),
                         name=TINY)
    engine.warm(CHUNKS)
    return engine


def _message(question: str) -> list[dict]:
    return [{"role": "user", "content": "\n\n".join(CHUNKS) + "\n\n" + question}]


def test_server_answers_in_doubt_as_the_library_alone_and_batched(tiny_engine):
    plain = _engine(tiny_engine)
    prompts = [plain.render_chat(_message(q)) for q in QUESTIONS]
    least = []  # per prompt, the least sure step of full reuse's answer: the gate's threshold splits them
    for prompt in prompts:
        pre = plain.prefill(prompt)
        assert pre.stats.chunk_hits == len(CHUNKS)  # the warmed passages are found in the raw prompt
        said = plain.generate_from(pre, max_new_tokens=TOKENS).token_ids
        least.append(min(top_margin(pre.resume(said[:i])[1]) for i in range(len(said))))
    gated = _engine(tiny_engine, doubt_margin=statistics.median(least))
    want = [gated.generate(p, max_new_tokens=TOKENS) for p in prompts]
    steps = [w.stats.doubt_step for w in want]
    assert None in steps and any(s is not None and s > 0 for s in steps), steps  # some redo mid-answer, some never
    with running(gated, model_names=[TINY]) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)

        def ask(q):
            out = client.chat.completions.create(model=TINY, messages=_message(q), max_tokens=TOKENS, temperature=0)
            return out.choices[0].message.content

        alone = [ask(q) for q in QUESTIONS]
        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            together = list(pool.map(ask, QUESTIONS))
        redos = metric(url, "doubt_redos_total")
    assert alone == [w.text for w in want] and together == alone
    assert redos == 2 * sum(s is not None for s in steps)
