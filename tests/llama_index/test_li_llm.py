"""CacheBlendLLM as a LlamaIndex LLM: metadata, one prompt path for every call form, async that
does not block the loop, usage that LlamaIndex's token counting reads, and refused bad input."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

from loop_probe import loop_stays_free

from llama_index_cacheblend import CacheBlendLLM, blend_stats

QUESTION = "Name three primary colours."
MESSAGES = [ChatMessage(role=MessageRole.USER, content=QUESTION)]


def test_metadata_comes_from_the_model_and_instances_share_one_engine(llm):
    meta = llm.metadata
    assert meta.context_window == llm.engine.context_window == 8192
    assert meta.num_output == llm.max_new_tokens == 24
    assert meta.is_chat_model is True and meta.model_name == "smollm2-135m-instruct"
    other = CacheBlendLLM(max_new_tokens=5, recompute_ratio=1.0)
    assert other.engine is llm.engine  # one set of weights, one memory KV store
    assert other.metadata.num_output == 5


def test_complete_and_chat_share_one_prompt_and_one_result(llm):
    prompt = llm.engine.render_chat([{"role": "user", "content": QUESTION}])
    assert llm.messages_to_prompt(MESSAGES) == prompt

    done = llm.complete(QUESTION)
    streamed = list(llm.stream_complete(QUESTION))
    chat = llm.chat(MESSAGES)
    chat_streamed = list(llm.stream_chat(MESSAGES))
    raw_formatted = llm.complete(prompt, formatted=True)

    assert done.text and done.text == streamed[-1].text == chat.message.content == raw_formatted.text
    assert "".join(r.delta for r in streamed) == done.text
    assert "".join(r.delta for r in chat_streamed) == chat_streamed[-1].message.content == done.text
    # usage rides on the final response of a stream (an empty delta) and equals the plain call's
    assert streamed[-1].delta == "" and streamed[-1].raw["usage"] == done.raw["usage"]
    assert chat.raw["usage"] == done.raw["usage"]
    stats = blend_stats(done)
    assert stats.prompt_tokens == len(llm.tokenize(prompt)) and stats.completion_tokens > 0


async def test_async_forms_match_and_leave_the_event_loop_free(llm):
    reference = llm.complete(QUESTION).text

    async with loop_stays_free(llm.engine):
        done = await llm.acomplete(QUESTION)
    async with loop_stays_free(llm.engine):
        pieces = [r async for r in await llm.astream_complete(QUESTION)]
    chat = await llm.achat(MESSAGES)
    chat_pieces = [r async for r in await llm.astream_chat(MESSAGES)]
    assert done.text == reference == pieces[-1].text == chat.message.content == chat_pieces[-1].message.content
    assert "".join(r.delta for r in pieces) == reference
    assert pieces[-1].raw["usage"]["prompt_tokens"] == done.raw["usage"]["prompt_tokens"]


async def test_concurrent_async_calls_answer_as_one_after_another(llm):
    """``asyncio.gather`` of streamed completions: each reads its stream on worker threads, their
    answers decode in the engine's shared batch, and each is the answer it gets alone."""
    questions = [QUESTION, "Name a colour.", "Count to five."]
    alone = [llm.complete(q) for q in questions]

    async def collect(question):
        return [r async for r in await llm.astream_complete(question)]

    together = await asyncio.gather(*(collect(q) for q in questions))
    assert [t[-1].text for t in together] == [a.text for a in alone]
    assert [t[-1].raw["usage"] for t in together] == [a.raw["usage"] for a in alone]
    assert llm.engine.decoder.active == 0


def test_token_counting_handler_reads_the_models_own_counts(llm):
    """TokenCountingHandler falls back to its own tokenizer when raw has no usage; give it a
    whitespace tokenizer so that only the model's counts in raw['usage'] can produce the numbers."""
    counter = TokenCountingHandler(tokenizer=str.split)
    own = CacheBlendLLM(max_new_tokens=12, callback_manager=CallbackManager([counter]))
    done = own.complete(QUESTION)
    list(own.stream_chat(MESSAGES))
    usage = done.raw["usage"]
    assert usage["prompt_tokens"] != len(own.completion_to_prompt(QUESTION).split())  # the fallback differs
    events = counter.llm_token_counts
    assert [e.prompt_token_count for e in events] == [usage["prompt_tokens"]] * 2
    assert [e.completion_token_count for e in events] == [usage["completion_tokens"]] * 2
    assert counter.total_llm_token_count == 2 * usage["total_tokens"]


def test_generation_options_per_call_and_unknown_ones_refused(llm):
    short = llm.complete(QUESTION, max_new_tokens=3)
    assert blend_stats(short).completion_tokens <= 3
    full = llm.complete(QUESTION, max_new_tokens=3, recompute_ratio=1.0)
    assert blend_stats(full).reused_tokens == 0 and blend_stats(full).recompute_ratio == 1.0
    with pytest.raises(ValueError, match="unsupported generation argument"):
        llm.complete(QUESTION, frequency_penalty=0.5)


def test_prompt_over_the_context_window_is_refused_before_any_compute(llm):
    long_prompt = "word " * (llm.metadata.context_window + 100)
    calls = []  # every forward pass of the model embeds its tokens first
    handle = llm.engine.adapter.body.embed_tokens.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        for call in (llm.complete, llm.stream_complete):
            with pytest.raises(ValueError, match="context window"):
                call(long_prompt)  # the stream raises at the call, not on first iteration
        assert not calls, f"{len(calls)} forward passes ran before the refusal"
        llm.complete(QUESTION, max_new_tokens=1)
        assert calls  # the hook sees a call that does compute
    finally:
        handle.remove()


def test_non_text_chat_content_is_refused(llm):
    png = bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
    message = ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text="What is this?"), ImageBlock(image=png)])
    with pytest.raises(ValueError, match="non-text content"):
        llm.chat([message])


def test_pickling_keeps_settings_and_the_shared_engine_and_leaves_the_original_intact(llm):
    """IngestionPipeline(num_workers>1) pickles transforms; other tools pickle LLMs. The engine is
    not serialised: unpickling gets the process's shared engine back from the public fields."""
    import pickle

    from llama_index_cacheblend import KVCacheWarmer

    own = CacheBlendLLM(max_new_tokens=7, system_prompt="Be brief.")
    copy = pickle.loads(pickle.dumps(own))
    assert copy.engine is own.engine and copy.to_dict() == own.to_dict()
    assert copy.messages_to_prompt(MESSAGES) == own.messages_to_prompt(MESSAGES)
    assert own.messages_to_prompt is not None and own.engine is llm.engine  # the original is untouched
    warmer = KVCacheWarmer()
    clone = pickle.loads(pickle.dumps(warmer))
    assert clone.engine is warmer.engine and clone.to_dict() == warmer.to_dict()


def test_importing_the_package_does_not_load_torch():
    """The engine, and torch with it, load with the first CacheBlendLLM, not with the import."""
    import subprocess
    import sys

    code = (
        "import sys, llama_index_cacheblend as m; "
        "m.CacheBlendLLM, m.KVCacheWarmer, m.WholeChunkSynthesizer, m.persist_index, m.BlendStatsHandler; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
