"""Query engines over a warmed FAISS index: reuse in any node order with answers that agree with
full prefill, and every way LlamaIndex can alter a node's text leads to compute, never reuse."""

from __future__ import annotations

import re

import pytest
from li_corpus import QUESTIONS
from li_helpers import answer_fidelity, fresh_documents, splitter
from llama_index.core import PromptHelper, VectorStoreIndex, get_response_synthesizer
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.llms import MockLLM
from llama_index.core.prompts.default_prompt_selectors import DEFAULT_TEXT_QA_PROMPT_SEL

from llama_index_cacheblend import (
    CacheBlendLLM,
    DroppedNodesWarning,
    KVCacheWarmer,
    WholeChunkSynthesizer,
    faiss_storage_context,
    llm_texts,
)

# "The blended answer agrees with full prefill", scored on the full-prefill greedy answer under
# teacher forcing: the blend picks the same top-1 token at >= 80% of its positions AND the mean
# KL(full || blend) of the next-token distributions is <= 0.3 nats. Free-running greedy texts
# are not compared: one early flip (often a synonym) sends the rest elsewhere, so text equality
# measures chaos, not cache fidelity. Measured with the bundled model on the five corpus questions
# (LlamaIndex's own prompts, ~870 tokens): at the default ratio 0.15, agreement 0.88-1.0 and KL
# 0.04-0.18; full reuse (ratio 0) KL 0.08-0.29; the same answer over one unrelated passage KL
# 0.29-2.1. The negative control below checks that the criterion rejects a wrong context.
MIN_AGREEMENT, MAX_KL = 0.8, 0.3


def sent_prompt(llm, call) -> str:
    return llm.messages_to_prompt(call.messages)


def test_reordered_second_query_reuses_its_chunks_and_agrees_with_full_prefill(persisted, llm, stats):
    index, _ = persisted
    engine = llm.engine
    # default response mode (compact); the first query only fixes an order, one token is enough
    first = index.as_query_engine(llm=CacheBlendLLM(max_new_tokens=1), similarity_top_k=5).query(QUESTIONS[0])
    second = index.as_query_engine(llm=llm, similarity_top_k=5).query(QUESTIONS[1])
    order = [[n.node.node_id for n in r.source_nodes] for r in (first, second)]
    assert set(order[0]) == set(order[1]) and order[0] != order[1]  # same nodes, another order

    call = stats.calls[-1]
    chunk_tokens = sum(engine.count_tokens(t) for t in llm_texts(n.node for n in second.source_nodes))
    assert (call.stats.chunk_hits, call.stats.chunk_misses) == (5, 0)
    assert call.stats.reused_tokens / chunk_tokens > 0.8

    prompt = sent_prompt(llm, call)
    full = engine.generate(prompt, max_new_tokens=llm.max_new_tokens, recompute_ratio=1.0)
    reference = engine.prefill(prompt, recompute_ratio=1.0)
    agreement, kl = answer_fidelity(reference, engine.prefill(prompt), full.token_ids)
    print(f"reuse={call.stats.reused_tokens / chunk_tokens:.3f} agreement={agreement:.3f} kl={kl:.3f}")
    print(f"blend: {second}\nfull:  {full.text}")
    assert agreement >= MIN_AGREEMENT and kl <= MAX_KL, (agreement, kl, str(second), full.text)

    # Negative control: the same answer over one unrelated passage fails the criterion.
    unrelated = llm_texts([second.source_nodes[-1].node])[0]
    template = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUESTIONS[1])
    wrong = engine.prefill(llm.format_template(template, context_str=unrelated))
    wrong_agreement, wrong_kl = answer_fidelity(reference, wrong, full.token_ids)
    print(f"unrelated context: agreement={wrong_agreement:.3f} kl={wrong_kl:.3f}")
    assert not (wrong_agreement >= MIN_AGREEMENT and wrong_kl <= MAX_KL)


def test_compact_resplit_computes_the_cut_nodes_and_reuses_only_whole_ones(persisted, short_llm, stats):
    """A small PromptHelper window (refine keeps 500 tokens of padding) makes compact mode re-split
    the joined node texts into windows."""
    index, _ = persisted
    llm = short_llm
    helper = PromptHelper(context_window=1100, num_output=24, chunk_overlap_ratio=0.0, tokenizer=llm.tokenize)
    synth = get_response_synthesizer(llm=llm, response_mode="compact", prompt_helper=helper)
    response = index.as_query_engine(llm=llm, similarity_top_k=5, response_synthesizer=synth).query(QUESTIONS[2])
    texts = llm_texts(n.node for n in response.source_nodes)
    prompts = [sent_prompt(llm, c) for c in stats.calls]
    assert len(prompts) >= 2  # one QA call and at least one refine call

    for call, prompt in zip(stats.calls, prompts):
        whole = [t for t in texts if t in prompt]
        assert call.stats.chunk_hits == len(whole)
        assert call.stats.cached_tokens == sum(llm.engine.count_tokens(t) for t in whole)
    cut = [t for t in texts if not any(t in p for p in prompts)]
    assert cut and all(any(t[:40] in p for p in prompts) for t in cut)  # present, but altered


def test_whole_chunk_synthesizer_sends_every_node_whole_in_one_call(persisted, short_llm, stats):
    index, _ = persisted
    llm = short_llm
    engine = index.as_query_engine(llm=llm, similarity_top_k=5, response_synthesizer=WholeChunkSynthesizer(llm))
    response = engine.query(QUESTIONS[2])
    assert len(stats.calls) == 1
    prompt = sent_prompt(llm, stats.calls[0])
    assert all(t in prompt for t in llm_texts(n.node for n in response.source_nodes))
    assert stats.last.chunk_hits == 5

    streaming = index.as_query_engine(
        llm=llm, similarity_top_k=5, response_synthesizer=WholeChunkSynthesizer(llm, streaming=True)
    )
    assert "".join(streaming.query(QUESTIONS[2]).response_gen) == str(response)
    assert sent_prompt(llm, stats.calls[-1]) == prompt


async def test_whole_chunk_synthesizer_async_paths_match_the_sync_answer(persisted, short_llm, stats):
    index, _ = persisted
    sync = index.as_query_engine(llm=short_llm, similarity_top_k=5, response_synthesizer=WholeChunkSynthesizer(short_llm))
    expected = str(sync.query(QUESTIONS[0]))
    plain = index.as_query_engine(llm=short_llm, similarity_top_k=5, response_synthesizer=WholeChunkSynthesizer(short_llm))
    assert str(await plain.aquery(QUESTIONS[0])) == expected
    streaming = index.as_query_engine(
        llm=short_llm, similarity_top_k=5, response_synthesizer=WholeChunkSynthesizer(short_llm, streaming=True)
    )
    response = await streaming.aquery(QUESTIONS[0])
    assert "".join([piece async for piece in response.async_response_gen()]) == expected
    assert [c.stats.chunk_hits for c in stats.calls] == [5, 5, 5]


def test_whole_chunk_fit_drops_whole_nodes_in_order_when_room_is_short(persisted):
    index, _ = persisted
    texts = llm_texts(index.docstore.docs.values())
    window = 8192
    tight = CacheBlendLLM(max_new_tokens=window - 600)  # leaves 600 tokens for the prompt
    synth = WholeChunkSynthesizer(tight)
    with pytest.warns(DroppedNodesWarning):
        kept = synth.fit(QUESTIONS[0], texts)
    assert 0 < len(kept) < len(texts)
    assert kept == [t for t in texts if t in kept]  # whole texts, retrieval order kept

    template = DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUESTIONS[0])

    def tokens(chunks):
        return tight.engine.count_tokens(tight.format_template(template, context_str="\n\n".join(chunks)))

    assert tokens(kept) <= 600
    assert all(tokens([*kept, t]) > 600 for t in texts if t not in kept)
    with pytest.raises(ValueError, match="no retrieved node fits"):
        WholeChunkSynthesizer(CacheBlendLLM(max_new_tokens=window - 100)).fit(QUESTIONS[0], texts)
    with pytest.raises(TypeError, match="needs a CacheBlendLLM"):
        WholeChunkSynthesizer(MockLLM())


def test_metadata_template_changed_after_warming_is_computed_not_reused(embed_model, short_llm, stats):
    llm = short_llm
    nodes = IngestionPipeline(transformations=[splitter(), KVCacheWarmer()], disable_cache=True).run(
        documents=fresh_documents("template")[:3]
    )

    def query(llm_, template: str):
        for node in nodes:
            node.metadata_template = template
        context = faiss_storage_context(embed_model.dimension)
        index = VectorStoreIndex(nodes, storage_context=context, embed_model=embed_model)
        response = index.as_query_engine(llm=llm_, similarity_top_k=3).query(QUESTIONS[0])
        return response, sent_prompt(llm, stats.calls[-1]), stats.last

    # Control: with the template the nodes were warmed with, they are reused.
    _, _, warm = query(CacheBlendLLM(max_new_tokens=2), "{key}: {value}")
    assert warm.chunk_hits == 3

    # The user changes how metadata renders after warming: nothing matches, all is computed.
    response, prompt, s = query(llm, "{key} => {value}")
    assert "title => " in prompt
    assert (s.chunk_hits, s.cached_tokens, s.reused_tokens) == (0, 0, 0)
    full = llm.engine.generate(prompt, max_new_tokens=llm.max_new_tokens, recompute_ratio=1.0)
    assert str(response) == full.text  # exactly the full-prefill answer


def test_simple_summarize_renders_a_list_repr_so_nothing_matches(persisted, stats):
    """llama-index-core 0.14.25 puts str(list_of_chunks) into the prompt: newlines escaped, quotes
    added. No node text matches, so everything is computed (correct, no speed-up)."""
    index, _ = persisted
    short = CacheBlendLLM(max_new_tokens=2)
    index.as_query_engine(llm=short, similarity_top_k=5, response_mode="simple_summarize").query(QUESTIONS[0])
    prompt = short.messages_to_prompt(stats.calls[-1].messages)
    assert re.search(r"\[['\"]title: ", prompt) and "\\n\\n" in prompt  # a list repr, newlines escaped
    assert stats.last.chunk_hits == 0 and stats.last.reused_tokens == 0
