"""KVCacheWarmer: warms exactly the prompt text of each node, idempotently, correctly under the
IngestionPipeline cache, through from_documents and insert, and says what it skipped."""

from __future__ import annotations

import pytest
from li_helpers import fresh_documents, kv_files, splitter
from llama_index.core import VectorStoreIndex
from llama_index.core.ingestion import IngestionCache, IngestionPipeline
from llama_index.core.ingestion.pipeline import get_transformation_hash
from llama_index.core.schema import ImageNode, TextNode

from cacheblend import DiskStore
from cacheblend.integrations import ChunkTooLongWarning
from llama_index_cacheblend import KVCacheWarmer, SkippedNodeWarning, faiss_storage_context, llm_texts
from kv_records import RECORDS_PER_CHUNK

PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAAAAgABVKJPXQAAAABJRU5ErkJggg=="
)


def stored_texts(warmer: KVCacheWarmer) -> set[str]:
    """The chunk texts in the warmer's disk store (its catalogue), for the warmer's model."""
    return set(DiskStore(warmer.store_dir, warmer.fingerprint).texts())


def test_pipeline_cache_hit_skips_rewarming_and_a_model_change_invalidates_it(tmp_path, tiny_model_dir):
    docs = fresh_documents("cache-on")[:2]
    store = str(tmp_path / "kv")
    cache = IngestionCache()
    warmer = KVCacheWarmer(store_dir=store)
    nodes = IngestionPipeline(transformations=[splitter(), warmer], cache=cache).run(documents=docs)
    files = kv_files(store)
    assert len(files) == RECORDS_PER_CHUNK * len(nodes) and len(nodes) == 2
    assert stored_texts(warmer) == set(llm_texts(nodes))  # the prompt text, metadata header included
    assert all(n.get_content("llm").startswith("title: ") for n in nodes)

    # Same model and store: the same cache key (even with other progress/batch settings), a cache hit.
    again = KVCacheWarmer(store_dir=store, show_progress=False, batch_size=1)
    split = splitter()(docs)
    assert get_transformation_hash(split, again) == get_transformation_hash(split, warmer)
    assert cache.get(get_transformation_hash(split, warmer)) is not None
    IngestionPipeline(transformations=[splitter(), again], cache=cache).run(documents=docs)
    assert kv_files(store) == files

    # Another model: another fingerprint in a public field, so another key; the warmer runs.
    other = KVCacheWarmer(model=tiny_model_dir, store_dir=store)
    assert other.fingerprint != warmer.fingerprint
    assert get_transformation_hash(split, other) != get_transformation_hash(split, warmer)
    IngestionPipeline(transformations=[splitter(), other], cache=cache).run(documents=docs)
    assert stored_texts(other) == stored_texts(warmer)
    assert len(kv_files(store)) == 2 * len(files) and all(kv_files(store)[f] == t for f, t in files.items())


async def test_pipeline_without_cache_is_idempotent_and_leaves_metadata_alone(tmp_path):
    docs = fresh_documents("cache-off")[:2]
    warmer = KVCacheWarmer(store_dir=str(tmp_path / "kv"))
    pipeline = IngestionPipeline(transformations=[splitter(), warmer], disable_cache=True)
    nodes = await pipeline.arun(documents=docs)  # the async path (acall) warms in a thread
    files = kv_files(warmer.store_dir)
    assert len(files) == 2 * RECORDS_PER_CHUNK
    again = pipeline.run(documents=docs)
    assert kv_files(warmer.store_dir) == files  # every chunk found: nothing computed or rewritten
    assert [n.metadata for n in again] == [n.metadata for n in nodes] == [d.metadata for d in docs]
    assert warmer.kv_location == f"disk:{warmer.store_dir}"
    assert KVCacheWarmer().kv_location.startswith("memory:")  # memory KV is scoped to this process


def test_from_documents_and_insert_warm_every_node(tmp_path, embed_model):
    docs = fresh_documents("insert")[:3]
    warmer = KVCacheWarmer(store_dir=str(tmp_path / "kv"))
    index = VectorStoreIndex.from_documents(
        docs[:2],
        storage_context=faiss_storage_context(embed_model.dimension),
        transformations=[splitter(), warmer],
        embed_model=embed_model,
    )
    assert len(kv_files(warmer.store_dir)) == 2 * RECORDS_PER_CHUNK
    index.insert(docs[2])  # the index re-runs its transformations, the warmer included
    assert len(index.docstore.docs) == 3
    assert stored_texts(warmer) == set(llm_texts(index.docstore.docs.values()))


def test_nodes_without_text_are_skipped_with_a_warning_or_refused_when_strict(tmp_path, capfd):
    caption = "Caption: the ferry Patient Gull crossing the Tane at dusk, photographed from Millhaven."
    nodes = [
        TextNode(text=""),
        TextNode(text="   \n"),
        ImageNode(image=PNG_B64),  # an image without caption or metadata: nothing to warm
        ImageNode(image=PNG_B64, text=caption),  # its caption is prompt text: warmed
        TextNode(text="A plain node about the skipped-nodes test.", metadata={"source": "unit"}),
    ]
    warmer = KVCacheWarmer(store_dir=str(tmp_path / "kv"), show_progress=True)
    with pytest.warns(SkippedNodeWarning, match="skipped 3 node"):
        out = warmer(nodes)
    assert out is nodes
    assert stored_texts(warmer) == {caption, "source: unit\n\nA plain node about the skipped-nodes test."}
    assert "warming KV" in capfd.readouterr().err  # the progress bar

    strict = KVCacheWarmer(store_dir=str(tmp_path / "kv"), strict=True)
    with pytest.raises(ValueError, match="3 node\\(s\\) have no text"):
        strict(nodes)


def test_an_over_long_node_is_skipped_with_a_warning_and_the_rest_of_the_batch_is_warmed(tmp_path):
    """The policy both integrations share: a node too long to be a chunk never loses its batch,
    and a short text is not warmed (it would be cut out of prompts that contain it as a word)."""
    warmer = KVCacheWarmer(store_dir=str(tmp_path / "kv"))
    normal = "A normal node about the over-long policy test, long enough to be warmed."
    huge = "word " * (warmer.engine.context_window + 100)
    with pytest.warns(ChunkTooLongWarning, match="exceeds the context window"):
        keys = warmer.warm([TextNode(text=huge), TextNode(text="ferry"), TextNode(text=normal)])
    assert len(keys) == 1 and stored_texts(warmer) == {normal}
