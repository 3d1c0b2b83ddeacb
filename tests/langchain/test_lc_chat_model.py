"""ChatCacheBlend on the real bundled model: what the standard suites do not pin down.

Template and completion-only output, stop strings, sampling options, token callbacks exactly once
on every path, a free event loop, cache_read/blend stats, and clear errors on bad input.
"""

import subprocess
import sys

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage

from lc_helpers import TokenRecorder
from loop_probe import loop_stays_free

from langchain_cacheblend import BUNDLED_MODEL, ChatCacheBlend
from langchain_cacheblend.chat_models import to_chat_messages

pytestmark = pytest.mark.real_model

QUESTION = [SystemMessage("You answer in one short sentence."), HumanMessage("What is the capital of France?")]


def rendered(engine, messages):
    return engine.render_chat(to_chat_messages(messages))


def test_bundled_alias_matches_the_engine():
    import cacheblend

    assert BUNDLED_MODEL == cacheblend.BUNDLED_MODEL


def test_import_and_construction_do_not_load_torch():
    code = (
        "import sys; from langchain_cacheblend import ChatCacheBlend, CacheBlendLLM; "
        "ChatCacheBlend(max_tokens=5); CacheBlendLLM(); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_instances_with_the_same_model_share_one_engine(engine):
    a, b = ChatCacheBlend(), ChatCacheBlend(temperature=0.5, max_tokens=3)
    assert a.get_engine() is b.get_engine() is engine


def test_applies_the_chat_template_and_returns_only_the_completion(engine):
    message = ChatCacheBlend(max_tokens=16).invoke(QUESTION)
    prompt = rendered(engine, QUESTION)
    assert prompt.startswith("<|im_start|>system\nYou answer in one short sentence.")
    expected = engine.generate(prompt, max_new_tokens=16)
    assert message.content == expected.text and "Paris" in message.content
    assert message.usage_metadata["input_tokens"] == expected.stats.prompt_tokens == len(engine.token_ids(prompt))
    assert message.usage_metadata["output_tokens"] == expected.stats.completion_tokens


def test_multi_token_stop_string_cuts_the_answer_in_invoke_and_stream(engine):
    model = ChatCacheBlend(max_tokens=10)
    free = model.invoke(QUESTION).content  # "The capital of France is Paris."
    stop = " is Paris"
    assert stop in free and engine.count_tokens(stop) >= 2
    cut = free[: free.index(stop)]
    assert model.invoke(QUESTION, stop=[stop]).content == cut
    assert "".join(c.content for c in model.stream(QUESTION, stop=[stop])) == cut
    assert ChatCacheBlend(max_tokens=10, stop=[stop]).invoke(QUESTION).content == cut  # field default


def test_max_tokens_and_per_call_overrides():
    model = ChatCacheBlend(max_tokens=16)
    short = model.invoke(QUESTION, max_tokens=3)
    assert short.usage_metadata["output_tokens"] == 3 and short.response_metadata["finish_reason"] == "length"
    assert model.bind(max_tokens=2).invoke(QUESTION).usage_metadata["output_tokens"] == 2


def test_unknown_call_options_are_an_error():
    with pytest.raises(ValueError, match="max_token"):
        ChatCacheBlend().invoke(QUESTION, max_token=3)


def test_temperature_seed_and_top_p_reach_the_sampler():
    model = ChatCacheBlend(max_tokens=6)
    greedy = model.invoke(QUESTION).content
    hot = [model.invoke(QUESTION, temperature=1.5, seed=s).content for s in (1, 2)]
    assert hot[0] == model.invoke(QUESTION, temperature=1.5, seed=1).content  # the seed fixes the sample
    assert len({greedy, *hot}) == 3  # the temperature is applied
    # A vanishing nucleus keeps only the likeliest token: hot sampling becomes greedy again.
    assert model.invoke(QUESTION, temperature=1.5, seed=1, top_p=1e-6).content == greedy


def test_token_callbacks_fire_exactly_once_per_piece_on_every_path():
    model = ChatCacheBlend(max_tokens=6)
    rec = TokenRecorder()
    out = model.invoke(QUESTION, config={"callbacks": [rec]})
    assert rec.texts() == [out.content] and len(rec.pieces()) >= 3

    rec = TokenRecorder()
    chunks = [c.content for c in model.stream(QUESTION, config={"callbacks": [rec]})]
    assert rec.texts() == ["".join(chunks)] == [out.content]
    assert rec.pieces() == [c for c in chunks if c]

    rec = TokenRecorder()
    streaming = ChatCacheBlend(max_tokens=6, streaming=True).invoke(QUESTION, config={"callbacks": [rec]})
    assert rec.texts() == [streaming.content] == [out.content]

    rec = TokenRecorder()
    batch = model.batch([QUESTION, [HumanMessage("Name a colour.")]], config={"callbacks": [rec]})
    assert sorted(rec.texts()) == sorted(m.content for m in batch)
    # batch runs invoke on threads; their answers decode in the engine's shared batch, each its own
    assert batch[0].content == out.content and batch[1].content == model.invoke([HumanMessage("Name a colour.")]).content

    rec = TokenRecorder()  # the v3 protocol path hands _stream a run manager and fires no tokens itself
    events = model.stream_events(QUESTION, version="v3", config={"callbacks": [rec]})
    assert list(events) and rec.texts() == [events.output.text] == [out.content]


def test_batch_decodes_its_inputs_together_each_in_its_own_run(engine):
    """``batch`` reads the inputs' streams in turn: each answer, its usage and finish reason are
    ``invoke``'s, every input has its own run (tokens and end), and the answers took about the
    longest one's decode steps, not the sum. With an LLM cache it is LangChain's own batch, and a
    second batch is answered from the cache without a step."""
    model = ChatCacheBlend(max_tokens=10)
    inputs = [QUESTION, [HumanMessage("Name a colour.")], "Count to five."]
    steps = engine.decoder.steps
    alone = [model.invoke(x) for x in inputs]
    steps, alone_steps = engine.decoder.steps, engine.decoder.steps - steps
    rec = TokenRecorder()
    together = model.batch(inputs, config={"callbacks": [rec]})
    assert engine.decoder.steps - steps <= 9 + len(inputs) < alone_steps
    assert all(type(m) is AIMessage for m in together)
    assert [m.content for m in together] == [m.content for m in alone]
    assert [m.usage_metadata for m in together] == [m.usage_metadata for m in alone]
    for a, b in zip(together, alone):
        assert {k: a.response_metadata[k] for k in ("finish_reason", "model_name", "model_provider")} == {
            k: b.response_metadata[k] for k in ("finish_reason", "model_name", "model_provider")}
        recomputed = [m.response_metadata["blend_stats"]["recomputed_tokens"] for m in (a, b)]
        assert recomputed[0] == recomputed[1]
    assert len(rec.tokens) == len(rec.results) == len(inputs)
    assert sorted(rec.texts()) == sorted(m.content for m in together)

    cached = ChatCacheBlend(max_tokens=10, cache=InMemoryCache())
    first = cached.batch(inputs)
    steps = engine.decoder.steps
    assert [m.content for m in cached.batch(inputs)] == [m.content for m in first] == [m.content for m in alone]
    assert engine.decoder.steps == steps


async def test_async_paths_fire_callbacks_once_and_keep_the_loop_free(engine):
    model = ChatCacheBlend(max_tokens=6)
    rec = TokenRecorder()
    async with loop_stays_free(engine):
        out = await model.ainvoke(QUESTION, config={"callbacks": [rec]})
    assert rec.texts() == [out.content] and len(rec.pieces()) >= 3
    rec = TokenRecorder()
    async with loop_stays_free(engine):
        chunks = [c.content async for c in model.astream(QUESTION, config={"callbacks": [rec]})]
    assert rec.texts() == ["".join(chunks)] == [out.content]
    rec = TokenRecorder()
    both = await model.abatch([QUESTION, QUESTION], config={"callbacks": [rec]})
    assert rec.texts() == [out.content, out.content] and [m.content for m in both] == rec.texts()
    rec = TokenRecorder()
    events = await model.astream_events(QUESTION, version="v3", config={"callbacks": [rec]})
    assert [e async for e in events] and rec.texts() == [out.content]


def test_usage_reports_cache_read_and_blend_stats(engine):
    from pydoc_data.topics import topics

    doc = topics["assert"].strip()
    engine.warm([doc])
    messages = [SystemMessage(f"Use this documentation:\n\n{doc}"), HumanMessage("What does assert do?")]
    model = ChatCacheBlend(max_tokens=4)
    blended = model.invoke(messages)
    stats = blended.response_metadata["blend_stats"]
    cache_read = blended.usage_metadata["input_token_details"]["cache_read"]
    assert stats["chunk_hits"] == 1 and stats["chunk_misses"] == 0
    assert cache_read == stats["reused_tokens"] > 0.8 * engine.count_tokens(doc)
    assert stats["recomputed_tokens"] + cache_read == blended.usage_metadata["input_tokens"]
    assert 0 < stats["ttft_s"] <= stats["total_s"]
    full = model.invoke(messages, recompute_ratio=1.0)
    assert full.usage_metadata["input_token_details"]["cache_read"] == 0
    assert full.response_metadata["blend_stats"]["recompute_ratio"] == 1.0


def test_token_counts_use_the_models_tokenizer_and_template(engine):
    text = "CacheBlend reuses KV caches."
    model = ChatCacheBlend(max_tokens=1)
    assert model.get_num_tokens(text) == engine.count_tokens(text)
    counted = model.get_num_tokens_from_messages(QUESTION)
    assert counted == model.invoke(QUESTION).usage_metadata["input_tokens"]  # what the model really read


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([HumanMessage([{"type": "image", "url": "https://example.com/cat.png"}])], "'image' content block"),
        ([HumanMessage([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}])],
         "'image_url' content block"),
        ([HumanMessage("hi"), AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "1"}])], "tool_calls"),
        ([ToolMessage("42", tool_call_id="1")], "ToolMessage is not supported"),
        ([ChatMessage(role="critic", content="hm")], "role 'critic'"),
        ([], "at least one message"),
    ],
)
def test_inputs_the_model_cannot_take_are_clear_errors(messages, match):
    with pytest.raises(ValueError, match=match):
        ChatCacheBlend(max_tokens=2).invoke(messages)


def test_text_content_blocks_are_accepted(engine):
    blocks = [HumanMessage([{"type": "text", "text": "What is the capital "}, "of France?"])]
    assert to_chat_messages(blocks) == [{"role": "user", "content": "What is the capital of France?"}]


def test_tool_binding_and_structured_output_are_refused_clearly():
    model = ChatCacheBlend()
    with pytest.raises(NotImplementedError, match="does not support tool calling"):
        model.bind_tools([{"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}])
    with pytest.raises(NotImplementedError, match="does not support tool calling"):
        model.with_structured_output({"title": "T", "type": "object", "properties": {"a": {"type": "string"}}})


def test_a_prompt_over_the_context_window_is_refused_before_compute(engine):
    long = "token " * (engine.context_window + 10)
    with pytest.raises(ValueError, match="context window"):
        ChatCacheBlend(max_tokens=2).invoke(long)


def test_a_base_model_without_chat_template_is_for_the_llm_class(base_model_dir):
    from langchain_cacheblend import CacheBlendLLM

    with pytest.raises(ValueError, match="no chat template; use CacheBlendLLM"):
        ChatCacheBlend(model=base_model_dir, max_tokens=1).invoke("hi")
    llm = CacheBlendLLM(model=base_model_dir, max_tokens=2)
    info = llm.generate(["Once upon a time"]).generations[0][0].generation_info
    engine = llm.get_engine()
    assert not engine.is_chat_model
    assert info["usage"]["input_tokens"] == len(engine.token_ids("Once upon a time"))  # sent raw
