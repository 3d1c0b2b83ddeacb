"""CacheBlendLLM (BaseLLM) on the real bundled model: prompt wrapping, callbacks, stop, metadata.

langchain-core's ``BaseLLM.stream()`` does not fire ``on_llm_new_token`` for the chunks that
``_stream`` yields (``BaseChatModel.stream()`` does); the class fires it itself, and these tests
pin "exactly once" on every path so that a change on either side shows up.
"""

import pytest
from langchain_core.prompts import PromptTemplate

from lc_helpers import TokenRecorder, format_docs, interleaves

from langchain_cacheblend import CacheBlendLLM

pytestmark = pytest.mark.real_model

PROMPT = "What is the capital of France? Answer in one sentence."


def test_prompt_goes_through_the_chat_template_unless_raw(engine):
    templated = CacheBlendLLM(max_tokens=12).invoke(PROMPT)
    expected = engine.generate(engine.render_chat([{"role": "user", "content": PROMPT}]), max_new_tokens=12)
    assert templated == expected.text and "Paris" in templated
    raw = CacheBlendLLM(max_tokens=12, apply_chat_template=False)
    assert raw.invoke(PROMPT) == engine.generate(PROMPT, max_new_tokens=12).text


def test_token_callbacks_fire_exactly_once_on_sync_paths():
    llm = CacheBlendLLM(max_tokens=6)
    rec = TokenRecorder()
    out = llm.invoke(PROMPT, config={"callbacks": [rec]})
    assert rec.texts() == [out] and sum(map(len, rec.tokens.values())) >= 3

    rec = TokenRecorder()
    pieces = list(llm.stream(PROMPT, config={"callbacks": [rec]}))
    assert rec.texts() == ["".join(pieces)] == [out]
    assert [t for run in rec.tokens.values() for t in run] == [p for p in pieces if p]

    # BaseLLM.batch sends all prompts through ONE _generate call that gets only the first run's
    # callback manager (langchain-core: "TODO: support multiple run managers"), and the answers
    # decode together: every token still fires once, in its answer's order, all under the first
    # run, the answers' tokens interleaved. max_concurrency=1 gives one run each.
    rec = TokenRecorder()
    outs = llm.batch([PROMPT, "Name a colour."], config={"callbacks": [rec]})
    assert len(rec.tokens) == 1 and interleaves(list(rec.tokens.values())[0], outs)
    rec = TokenRecorder()
    outs = llm.batch([PROMPT, "Name a colour."], config={"callbacks": [rec], "max_concurrency": 1})
    assert rec.texts() == outs


def test_a_batch_decodes_its_answers_together_and_each_is_its_answer_alone(engine):
    """``generate``/``batch`` (one ``_generate`` for every prompt) give each prompt the answer and
    usage it gets alone, and the answers shared the engine's decode steps."""
    llm = CacheBlendLLM(max_tokens=10)
    prompts = [PROMPT, "Name a colour.", "Count to five."]
    steps = engine.decoder.steps
    alone = [llm.generate([p]).generations[0][0] for p in prompts]
    steps, alone_steps = engine.decoder.steps, engine.decoder.steps - steps
    together = [g[0] for g in llm.generate(prompts).generations]
    assert [g.text for g in together] == [g.text for g in alone]
    assert [g.generation_info["usage"] for g in together] == [g.generation_info["usage"] for g in alone]
    # alone, the steps of every answer one after another; together, about the longest answer's
    assert engine.decoder.steps - steps <= 9 + len(prompts) < alone_steps
    assert llm.batch(prompts) == [g.text for g in alone]


async def test_a_batch_decodes_together_on_the_async_path_too(engine):
    llm = CacheBlendLLM(max_tokens=10)
    prompts = [PROMPT, "Name a colour."]
    steps = engine.decoder.steps
    alone = [llm.invoke(p) for p in prompts]
    steps, alone_steps = engine.decoder.steps, engine.decoder.steps - steps
    assert await llm.abatch(prompts) == alone
    assert engine.decoder.steps - steps <= 9 + len(prompts) < alone_steps


async def test_token_callbacks_fire_exactly_once_on_async_paths():
    llm = CacheBlendLLM(max_tokens=6)
    rec = TokenRecorder()
    out = await llm.ainvoke(PROMPT, config={"callbacks": [rec]})
    assert rec.texts() == [out]
    rec = TokenRecorder()
    pieces = [p async for p in llm.astream(PROMPT, config={"callbacks": [rec]})]
    assert rec.texts() == ["".join(pieces)] == [out]


def test_stop_strings_and_generation_info(engine):
    llm = CacheBlendLLM(max_tokens=10)
    free = llm.invoke(PROMPT)
    stop = " is Paris"
    assert stop in free and engine.count_tokens(stop) >= 2
    assert llm.invoke(PROMPT, stop=[stop]) == free[: free.index(stop)]
    assert "".join(llm.stream(PROMPT, stop=[stop])) == free[: free.index(stop)]

    result = llm.generate([PROMPT])
    info = result.generations[0][0].generation_info
    assert info["finish_reason"] in ("stop", "length")
    assert info["usage"]["input_tokens"] == info["blend_stats"]["prompt_tokens"] > 0
    assert info["usage"]["input_token_details"]["cache_read"] == info["blend_stats"]["reused_tokens"]
    assert result.llm_output["token_usage"]["completion_tokens"] == info["blend_stats"]["completion_tokens"]

    rec = TokenRecorder()
    list(llm.stream(PROMPT, config={"callbacks": [rec]}))  # the stream's closing chunk carries the info
    assert rec.results[0].generations[0][0].generation_info["blend_stats"]["completion_tokens"] > 0


def test_string_prompt_rag_chain_reuses_warmed_passages(engine, rag_store):
    """The HuggingFacePipeline-style chain: retriever -> string prompt -> LLM."""
    prompt = PromptTemplate.from_template("Documentation:\n\n{context}\n\nQuestion: {question}\nAnswer:")
    question = "What does the global statement declare?"
    docs = rag_store.as_retriever(search_kwargs={"k": 3}).invoke(question)
    rec = TokenRecorder()
    chain = prompt | CacheBlendLLM(max_tokens=6)
    chain.invoke({"context": format_docs(docs), "question": question}, config={"callbacks": [rec]})
    stats = rec.results[0].generations[0][0].generation_info["blend_stats"]
    assert stats["chunk_hits"] == 3 and stats["chunk_misses"] == 0
    assert stats["reused_tokens"] > 0.8 * sum(engine.count_tokens(d.page_content) for d in docs)


def test_over_the_context_window_is_refused(engine):
    with pytest.raises(ValueError, match="context window"):
        CacheBlendLLM(max_tokens=2).invoke("word " * (engine.context_window + 10))
