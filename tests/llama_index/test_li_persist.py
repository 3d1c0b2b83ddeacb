"""A FAISS index persisted with its KV store: reloaded in a new process it reuses the stored KV
without computing any; a KV store written for another model is never reused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kv_records import RECORDS_PER_CHUNK
from li_corpus import QUESTIONS
from li_helpers import fresh_documents, kv_files, splitter
from llama_index.core import VectorStoreIndex

import cacheblend
from llama_index_cacheblend import (
    ForeignKVStoreWarning,
    KVCacheWarmer,
    faiss_storage_context,
    kv_store_dir,
    load_faiss_index,
    persist_index,
)

RELOAD = r"""
import json, sys
from llama_index.core import Settings
from llama_index_cacheblend import CacheBlendLLM, SentenceTransformerEmbedding, load_faiss_index, record_blend_stats

persist_dir, question = sys.argv[1], sys.argv[2]
llm = CacheBlendLLM(max_new_tokens=4)
embed = SentenceTransformerEmbedding()
Settings.llm, Settings.embed_model = llm, embed
index = load_faiss_index(persist_dir, embed_model=embed, engine=llm.engine)
in_memory_after_load = len(llm.engine.kv.stores.memory)  # 0: loading computed and copied nothing
with record_blend_stats() as stats:
    response = index.as_query_engine(llm=llm, similarity_top_k=5).query(question)
print(json.dumps({"in_memory_after_load": in_memory_after_load, "stats": stats.last.as_dict(),
                  "nodes": len(response.source_nodes)}))
"""


def test_reloaded_in_a_new_process_reuses_the_stored_kv_without_rewarming(persisted):
    _, persist_dir = persisted
    names = {p.name for p in Path(persist_dir).iterdir()}
    assert {"default__vector_store.json", "docstore.json", "index_store.json", "cacheblend"} <= names
    before = kv_files(kv_store_dir(persist_dir))
    assert len(before) == 5 * RECORDS_PER_CHUNK

    run = subprocess.run(
        [sys.executable, "-c", RELOAD, str(persist_dir), QUESTIONS[0]],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["in_memory_after_load"] == 0
    assert result["nodes"] == 5
    assert (result["stats"]["chunk_hits"], result["stats"]["chunk_misses"]) == (5, 0)
    assert result["stats"]["reused_tokens"] > 0.8 * result["stats"]["hit_tokens"]
    assert kv_files(kv_store_dir(persist_dir)) == before  # same files, same mtimes: nothing rewritten


def test_a_kv_store_written_for_another_model_is_never_reused(tmp_path, tiny_model_dir, embed_model, short_llm, stats):
    llm = short_llm
    other = cacheblend.shared_engine(tiny_model_dir)
    warmer = KVCacheWarmer(model=tiny_model_dir, store_dir=str(kv_store_dir(tmp_path)))
    index = VectorStoreIndex.from_documents(
        fresh_documents("foreign")[:3],
        storage_context=faiss_storage_context(embed_model.dimension),
        transformations=[splitter(), warmer],
        embed_model=embed_model,
    )
    persist_index(index, tmp_path, other)
    assert len(kv_files(kv_store_dir(tmp_path))) == 3 * RECORDS_PER_CHUNK

    with pytest.warns(ForeignKVStoreWarning, match="other model fingerprints"):
        loaded = load_faiss_index(tmp_path, embed_model, engine=llm.engine)
    response = loaded.as_query_engine(llm=llm, similarity_top_k=3).query(QUESTIONS[0])
    s = stats.last
    assert (s.chunk_hits, s.hit_tokens, s.reused_tokens) == (0, 0, 0)
    prompt = llm.messages_to_prompt(stats.calls[-1].messages)
    full = llm.engine.generate(prompt, max_new_tokens=llm.max_new_tokens, recompute_ratio=1.0)
    assert str(response) == full.text  # computed: exactly the full-prefill answer
