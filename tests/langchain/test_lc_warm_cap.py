"""CacheBlendFAISS(warm_limit=N): a large corpus indexes without warming all of it; the documents
past the cap are found in prompts and warmed on miss, so a retrieval's second use hits."""

from langchain_core.documents import Document
from lc_helpers import fresh_texts

from cacheblend import BlendEngine


def test_a_capped_index_warms_its_first_documents_and_the_rest_after_their_first_use(engine, embeddings):
    from langchain_cacheblend import CacheBlendFAISS

    own = BlendEngine(engine.adapter.model, engine.tokenizer)  # its own stores: warm on miss stays in this test
    try:
        texts = fresh_texts(3, "warm cap")
        store = CacheBlendFAISS.from_documents([Document(page_content=t) for t in texts], embeddings, engine=own,
                                               warm_limit=1)
        assert [own.kv.is_warm(t) for t in texts] == [True, False, False]
        store.add_texts([fresh_texts(1, "warm cap, added later")[0]])  # past the cap too
        assert own.kv.misses is not None and own.kv.misses.offered == 0  # nothing computed yet for the rest
        docs = store.similarity_search(texts[1], k=3)
        prompt = "\n\n".join(d.page_content for d in docs) + "\n\nWhat do these say?"
        first = own.generate(prompt, max_new_tokens=2)
        assert first.stats.chunk_hits + first.stats.chunk_misses == 3 and first.stats.chunk_misses >= 2
        assert own.warm_pending(120)
        again = own.generate(prompt, max_new_tokens=2)
        assert (again.stats.chunk_hits, again.stats.chunk_misses) == (3, 0)
    finally:
        own.close()
