"""CacheBlendFAISS: every way of adding documents warms them; FAISS behaviour is untouched;
save/load carries the KV store; half-written folders and other models' stores are handled.

Whether a text is warmed is checked the way it matters: a prompt that contains it is prefilled
and the engine reports a chunk hit (a text never warmed is not even looked for: 0 hits, 0 misses).
"""

import json
import os
import warnings
from pathlib import Path

import pytest
from langchain_community.vectorstores import FAISS
from kv_records import RECORDS_PER_CHUNK
from langchain_core.documents import Document
from lc_helpers import fresh_texts

from cacheblend import BlendEngine, StoreWarning
from cacheblend.stores import LEAD, chunk_key
from langchain_cacheblend import BUNDLED_MODEL, CacheBlendFAISS

pytestmark = pytest.mark.real_model


def lookup(engine, texts):
    """(chunk hits, chunk misses) of a prompt holding ``texts``."""
    content = "Notes:\n\n" + "\n\n".join(texts)
    messages = [{"role": "system", "content": content}, {"role": "user", "content": "?"}]
    stats = engine.prefill(engine.render_chat(messages)).stats
    return stats.chunk_hits, stats.chunk_misses


def kv_files(folder):
    return {p: p.stat().st_mtime_ns for p in Path(folder, "cacheblend").rglob("*.safetensors")}


def docs_of(texts):
    return [Document(page_content=t, metadata={"n": i}) for i, t in enumerate(texts)]


ADDERS = {
    "from_documents": lambda texts, emb, seed: CacheBlendFAISS.from_documents(docs_of(texts), emb),
    "from_texts": lambda texts, emb, seed: CacheBlendFAISS.from_texts(texts, emb),
    "from_embeddings": lambda texts, emb, seed: CacheBlendFAISS.from_embeddings(
        list(zip(texts, emb.embed_documents(texts))), emb
    ),
    "add_documents": lambda texts, emb, seed: seed.add_documents(docs_of(texts)),
    "add_texts": lambda texts, emb, seed: seed.add_texts(texts),
    "add_embeddings": lambda texts, emb, seed: seed.add_embeddings(list(zip(texts, emb.embed_documents(texts)))),
    "merge_from": lambda texts, emb, seed: seed.merge_from(FAISS.from_texts(texts, emb)),
    "deserialize_from_bytes": lambda texts, emb, seed: CacheBlendFAISS.deserialize_from_bytes(
        FAISS.from_texts(texts, emb).serialize_to_bytes(), emb, allow_dangerous_deserialization=True
    ),
}


@pytest.mark.parametrize("way", list(ADDERS))
def test_every_way_of_adding_documents_warms_them(way, engine, embeddings):
    seed = CacheBlendFAISS.from_texts(fresh_texts(1, f"seed-{way}"), embeddings)
    texts = fresh_texts(2, way)
    assert lookup(engine, texts) == (0, 0)
    ADDERS[way](texts, embeddings, seed)
    assert lookup(engine, texts) == (2, 0)


async def test_async_ways_of_adding_documents_warm_them(engine, embeddings):
    for way in ("afrom_documents", "aadd_documents", "aadd_texts", "afrom_embeddings"):
        texts = fresh_texts(2, way)
        assert lookup(engine, texts) == (0, 0)
        if way == "afrom_documents":
            await CacheBlendFAISS.afrom_documents(docs_of(texts), embeddings)
        elif way == "afrom_embeddings":
            await CacheBlendFAISS.afrom_embeddings(list(zip(texts, embeddings.embed_documents(texts))), embeddings)
        else:
            seed = CacheBlendFAISS.from_texts(fresh_texts(1, f"seed-{way}"), embeddings)
            await (seed.aadd_documents(docs_of(texts)) if way == "aadd_documents" else seed.aadd_texts(texts))
        assert lookup(engine, texts) == (2, 0), way


def test_search_metadata_and_ids_are_plain_faiss(corpus, embeddings):
    plain = FAISS.from_documents(corpus, embeddings, ids=[d.metadata["topic"] for d in corpus])
    ours = CacheBlendFAISS.from_documents(corpus, embeddings, ids=[d.metadata["topic"] for d in corpus])
    query = "Which statement leaves a loop early?"
    assert ours.similarity_search_with_score(query, k=4) == plain.similarity_search_with_score(query, k=4)
    assert ours.as_retriever().invoke(query) == plain.as_retriever().invoke(query)
    stored = ours.get_by_ids([d.metadata["topic"] for d in corpus])
    assert [d.metadata for d in stored] == [d.metadata for d in corpus]  # no KV keys in metadata
    assert [d.page_content for d in stored] == [d.page_content for d in corpus]


def test_blank_tiny_and_oversized_documents_are_indexed_but_not_warmed(engine, embeddings):
    normal = fresh_texts(1, "normal")
    oversized = "word " * (engine.context_window + 100)
    with pytest.warns(UserWarning, match="exceeds the context window"):
        store = CacheBlendFAISS.from_texts(["", "   \n", "ferry", oversized, *normal], embeddings)
    assert store.index.ntotal == 5
    assert lookup(engine, normal) == (1, 0)
    # A warmed "ferry" would be cut out of this prompt as a chunk, changing its tokenization.
    prompt = engine.render_chat([{"role": "user", "content": "Take the ferry to the island."}])
    assert engine.request(prompt).text.chunks == ()


def test_save_local_writes_faiss_files_and_a_pickle_free_kv_store(tmp_path, engine, embeddings):
    texts = fresh_texts(3, "layout")
    CacheBlendFAISS.from_texts(texts, embeddings).save_local(tmp_path)
    assert (tmp_path / "index.faiss").is_file() and (tmp_path / "index.pkl").is_file()
    ours = [p for p in (tmp_path / "cacheblend").rglob("*") if p.is_file()]
    assert {p.suffix for p in ours} == {".json", ".jsonl", ".safetensors"}  # no pickle of ours
    assert len(kv_files(tmp_path)) == 3 * RECORDS_PER_CHUNK
    manifest = json.loads((tmp_path / "cacheblend" / "index.json").read_text())
    assert manifest == {"format": 1, "model": BUNDLED_MODEL, "documents": 3}


def test_load_local_keeps_faiss_pickle_opt_in(tmp_path, embeddings):
    CacheBlendFAISS.from_texts(fresh_texts(1, "optin"), embeddings).save_local(tmp_path)
    with pytest.raises(ValueError, match="allow_dangerous_deserialization"):
        CacheBlendFAISS.load_local(tmp_path, embeddings)


@pytest.mark.parametrize("remove", ["index.pkl", "index.faiss", "folder"])
def test_half_written_index_folder_is_a_clear_error(tmp_path, embeddings, remove):
    CacheBlendFAISS.from_texts(fresh_texts(1, "torn"), embeddings).save_local(tmp_path / "ix")
    folder = tmp_path / ("missing" if remove == "folder" else "ix")
    if remove != "folder":
        (folder / remove).unlink()
    with pytest.raises(FileNotFoundError, match="no complete FAISS index"):
        CacheBlendFAISS.load_local(folder, embeddings, allow_dangerous_deserialization=True)


def test_interrupted_save_is_completed_on_load(tmp_path, engine, embeddings):
    """FAISS files written, KV only partly: what a crash inside save_local leaves behind."""
    texts = fresh_texts(3, "interrupted")
    store = CacheBlendFAISS.from_texts(texts[:1], embeddings)
    store.save_local(tmp_path)
    first = kv_files(tmp_path)
    store.add_texts(texts[1:])
    FAISS.save_local(store, str(tmp_path))  # the FAISS half of save_local only
    with pytest.warns(UserWarning, match="2 document"):
        loaded = CacheBlendFAISS.load_local(tmp_path, embeddings, allow_dangerous_deserialization=True)
    after = kv_files(tmp_path)
    assert len(after) == 3 * RECORDS_PER_CHUNK and all(after[p] == first[p] for p in first)  # only the missing were written
    assert loaded.engine is engine and lookup(engine, texts) == (3, 0)


def test_index_saved_by_plain_faiss_is_warmed_on_load_or_left_to_query_time(tmp_path, engine, embeddings):
    for warm_missing in (True, False):
        texts = fresh_texts(2, f"plain-{warm_missing}")
        folder = tmp_path / str(warm_missing)
        FAISS.from_texts(texts, embeddings).save_local(str(folder))
        with pytest.warns(UserWarning, match="2 document.*" + ("warming" if warm_missing else "query time")):
            CacheBlendFAISS.load_local(folder, embeddings, allow_dangerous_deserialization=True,
                                       warm_missing=warm_missing)
        assert len(kv_files(folder)) == (2 * RECORDS_PER_CHUNK if warm_missing else 0)
        assert lookup(engine, texts) == ((2, 0) if warm_missing else (0, 0))


def test_kv_store_of_another_model_is_never_reused(tmp_path, engine, embeddings, tiny_model_dir):
    from langchain_cacheblend import ChatCacheBlend

    texts = fresh_texts(2, "other-model")
    CacheBlendFAISS.from_texts(texts, embeddings).save_local(tmp_path)
    bundled_files = kv_files(tmp_path)
    messages = [("system", "Notes:\n\n" + "\n\n".join(texts)), ("human", "?")]
    tiny_chat = ChatCacheBlend(model=tiny_model_dir, max_tokens=1)

    # The engine says the store holds only another model's KV; the vector store, what it does about it.
    with pytest.warns(StoreWarning, match="other models"), pytest.warns(UserWarning, match="2 document.*query time"):
        CacheBlendFAISS.load_local(tmp_path, embeddings, allow_dangerous_deserialization=True,
                                   engine=tiny_model_dir, warm_missing=False)
    stats = tiny_chat.invoke(messages).response_metadata["blend_stats"]
    assert stats["chunk_hits"] == 0 and stats["reused_tokens"] == stats["head_tokens"]  # computed, not read (a
    # head the engine computed before, the template's, is read: tests/core/test_head_cache.py)

    with pytest.warns(StoreWarning, match="other models"), pytest.warns(UserWarning, match="2 document.*warming"):
        CacheBlendFAISS.load_local(tmp_path, embeddings, allow_dangerous_deserialization=True, engine=tiny_model_dir)
    assert tiny_chat.invoke(messages).response_metadata["blend_stats"]["chunk_hits"] == 2  # its own KV now
    assert kv_files(tmp_path) | bundled_files == kv_files(tmp_path) and len(kv_files(tmp_path)) == 4 * RECORDS_PER_CHUNK
    assert all(kv_files(tmp_path)[p] == t for p, t in bundled_files.items())  # the bundled KV untouched
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the manifest names the bundled model
        assert CacheBlendFAISS.load_local(tmp_path, embeddings, allow_dangerous_deserialization=True).engine is engine


def test_torn_kv_file_is_recomputed_with_a_warning(tmp_path, embeddings, tiny_model_dir):
    """Fresh engines (empty memory) on the tiny model, so the torn files are really read. A chunk
    whose every record is torn is computed; one with an intact record left is served from it."""
    texts = fresh_texts(2, "torn-file")
    writer = BlendEngine.from_pretrained(tiny_model_dir)
    CacheBlendFAISS.from_texts(texts, embeddings, engine=writer).save_local(tmp_path)
    ids = writer.kv.encode(texts[0]).ids
    keys = [chunk_key(writer.kv.fingerprint, ids, LEAD), chunk_key(writer.kv.fingerprint, ids)]  # what it reads first
    victims = sorted((p for p in kv_files(tmp_path) if p.stem in keys), key=lambda p: keys.index(p.stem))
    assert len(victims) == RECORDS_PER_CHUNK
    for n, victim in enumerate(victims):
        victim.write_bytes(victim.read_bytes()[: os.path.getsize(victim) // 2])
        reader = BlendEngine.from_pretrained(tiny_model_dir)
        CacheBlendFAISS.load_local(tmp_path, embeddings, allow_dangerous_deserialization=True, engine=reader)
        with pytest.warns(StoreWarning, match="unreadable"):
            assert lookup(reader, texts) == ((1, 1) if n == len(victims) - 1 else (2, 0))


NEIGHBOURLY = [
    "The harbour of Kelm keeps three wooden ships: the Auk, the Tern and the Petrel, all built in Kelm.",
    "The Auk and the Tern, wooden ships of the Kelm harbour, sail to the salt islands every summer.",
    "The Petrel, the oldest wooden ship of Kelm harbour, was rebuilt after the storm of 1902.",
    "Beekeepers on the Varn hills move their hives to the heather fields late in July each year.",
    "Heather honey from the Varn hills is dark and thick; the beekeepers press it from the comb.",
]


def test_an_engine_warming_behind_neighbours_gets_them_from_the_faiss_index(engine, embeddings):
    """With BlendConfig(neighbours=2), each document is computed behind its two nearest documents by
    the index's own vectors: the ones its retriever returns beside it."""
    import torch

    from cacheblend import BlendConfig
    from cacheblend.blending.warm_forward import forward_padded
    from cacheblend.neighbours import behind

    nb = BlendEngine(engine.adapter.model, engine.tokenizer, config=BlendConfig(neighbours=2))
    def retrieved(store, text):
        return [d.page_content for d in store.similarity_search(text, k=3) if d.page_content != text][:2]

    store = CacheBlendFAISS.from_texts(NEIGHBOURLY[:-1], embeddings, engine=nb)
    near = {t: retrieved(store, t) for t in NEIGHBOURLY[:-1]}  # the index as each was warmed
    asked = []
    nearest = store.nearest_texts
    store.nearest_texts = lambda texts: asked.append(list(texts)) or nearest(texts)
    store.add_texts(NEIGHBOURLY[-1:])
    assert asked == [NEIGHBOURLY[-1:]]  # warming asked the index for the new document's neighbours
    near[NEIGHBOURLY[-1]] = retrieved(store, NEIGHBOURLY[-1])
    assert nearest(NEIGHBOURLY[-1:]) == [near[NEIGHBOURLY[-1]]]
    for text in NEIGHBOURLY:
        ids = nb.kv.encode(text).ids
        placed = behind([nb.kv.encode(t).ids for t in near[text]], len(nb.kv.context_ids) + len(ids), nb.context_window)
        context = [*nb.kv.context_ids, *(t for n in placed for t in n)]
        expected = forward_padded(nb.adapter, context, [ids])[0].to(torch.float16)
        stored = nb.kv.stores.get(nb.kv.keys([text])[0]).kv
        torch.testing.assert_close(stored, expected, atol=1e-3, rtol=1e-3)
    assert store.nearest_texts(["a text the index does not hold, long enough to be warmed"]) == [None]
    assert lookup(nb, NEIGHBOURLY[:2]) == (2, 0)
