# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # RAG with LlamaIndex and cacheblend: warm once, reuse the KV of every retrieved node
#
# A RAG prompt is mostly retrieved text. A normal LLM prefills all of it on every query, even when
# the same passages come back again in another order. cacheblend computes each node's KV cache
# once, at indexing time, and at query time reuses it wherever the node lands in the prompt,
# recomputing only the ~15% of tokens whose KV deviates most plus the question and template.
#
# This notebook builds a FAISS index over the Python language reference (it ships with CPython, so
# this runs offline), warms the KV during ingestion, and compares time to first token (TTFT) of
# the same LlamaIndex query engine with and without reuse.
#
# Run it: `.venv/bin/python cookbooks/llamaindex_rag.py` (about two minutes on 2 CPU cores). On a
# machine busy with other work, `OMP_NUM_THREADS=1` gives steadier timings: two torch threads
# competing with other processes for two cores slow every prefill down several times.

# %%
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import shutil
import statistics
from pathlib import Path

from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter
from pydoc_data.topics import topics

from llama_index_cacheblend import (
    CacheBlendLLM,
    KVCacheWarmer,
    SentenceTransformerEmbedding,
    faiss_storage_context,
    kv_store_dir,
    load_faiss_index,
    persist_index,
    record_blend_stats,
)

OUT = Path(__file__).resolve().parent / "out" if "__file__" in globals() else Path("out")
PERSIST_DIR = OUT / "llamaindex_faiss"
shutil.rmtree(PERSIST_DIR, ignore_errors=True)  # start cold, so the warming below really computes
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## Models: everything local
#
# `CacheBlendLLM` loads the bundled SmolLM2-135M-Instruct; every instance with the same model shares
# one engine (weights and in-memory KV store), which is how the warmer and the LLM meet. Passing
# `llm` and `embed_model` (and setting `Settings`) keeps LlamaIndex from reaching for OpenAI.
# `Settings.tokenizer = llm.tokenize` makes LlamaIndex count tokens the way the model does when it
# packs context.

# %%
llm = CacheBlendLLM(max_new_tokens=32)
full_prefill_llm = CacheBlendLLM(max_new_tokens=32, recompute_ratio=1.0)  # the baseline: no cache read
embed_model = SentenceTransformerEmbedding()
Settings.llm, Settings.embed_model, Settings.tokenizer = llm, embed_model, llm.tokenize
print(llm.metadata)

# %% [markdown]
# ## Ingestion with warming
#
# `KVCacheWarmer` goes last in the transformations, after the splitter: it warms exactly the text
# LlamaIndex will put into prompts, `node.get_content(MetadataMode.LLM)` (here `topic: ...` plus
# the chunk). With `store_dir=<persist_dir>/cacheblend` the KV is written beside the FAISS index
# as safetensors files. `index.insert(doc)` re-runs the same transformations, so later documents
# are warmed too.

# %%
TOPICS = ["with", "try", "raise", "exceptions", "for", "global", "nonlocal", "assert", "del", "return", "yield"]
documents = [Document(text=topics[name], metadata={"topic": name}) for name in TOPICS]
warmer = KVCacheWarmer(store_dir=str(kv_store_dir(PERSIST_DIR)), show_progress=True)
index = VectorStoreIndex.from_documents(
    documents,
    storage_context=faiss_storage_context(embed_model.dimension),
    transformations=[SentenceSplitter(chunk_size=256, chunk_overlap=0), warmer],
    embed_model=embed_model,
)
persist_index(index, PERSIST_DIR, llm.engine)  # FAISS + docstore; the KV is already there
kv_bytes = sum(p.stat().st_size for p in kv_store_dir(PERSIST_DIR).rglob("*.safetensors"))
node_tokens = sum(llm.engine.count_tokens(n.get_content("llm")) for n in index.docstore.docs.values())
print(f"{len(index.docstore.docs)} nodes, {node_tokens} tokens, KV on disk {kv_bytes / 2**20:.1f} MiB "
      f"({kv_bytes / node_tokens / 1024:.1f} KiB/token)")

# %% [markdown]
# ## Reload, as a serving process would
#
# `load_faiss_index` reads the FAISS index and storage context and attaches the KV store: nothing is
# recomputed (the tests check this in a fresh process).

# %%
index = load_faiss_index(PERSIST_DIR, embed_model, engine=llm.engine)

# %% [markdown]
# ## Cold vs warm TTFT through the same query engine
#
# Same retriever (top 6 nodes), same default response mode (`compact`: the six nodes fit the
# 8k-token window, so they reach the prompt whole, joined by blank lines). The only difference is
# the LLM: `recompute_ratio=1.0` is a full prefill (what any LLM without cross-chunk KV reuse
# pays), the default reuses the warmed KV. Stats come from LlamaIndex's instrumentation events.

# %%
QUESTIONS = [
    "What methods does the with statement call on the context manager?",
    "When is the else clause of a try statement executed?",
    "What does the nonlocal statement do?",
    "What happens to assert statements when optimization is requested?",
    "How does raise ... from ... set the cause of an exception?",
    "What does a yield expression do inside a function?",
]


def ask(model, question):
    with record_blend_stats() as stats:
        response = index.as_query_engine(llm=model, similarity_top_k=6).query(question)
    return str(response), stats.last


ask(llm, "warm-up: what is a for loop?")  # the first call pays one-off start-up costs
rows = []
for question in QUESTIONS:
    cold_answer, cold = ask(full_prefill_llm, question)
    warm_answer, warm = ask(llm, question)
    rows.append((question, cold, warm, cold_answer, warm_answer))
    print(f"{question}\n  cold TTFT {cold.ttft_s:.2f}s  warm TTFT {warm.ttft_s:.2f}s  "
          f"hits {warm.chunk_hits}/{warm.chunk_hits + warm.chunk_misses}  "
          f"reused {warm.reused_tokens}/{warm.prompt_tokens} prompt tokens")
    print(f"  full prefill: {cold_answer.strip()[:110]!r}\n  cacheblend:   {warm_answer.strip()[:110]!r}")

# %% [markdown]
# ## Summary and plot
#
# Hit rate: retrieved nodes found whole in the prompt with their KV in the store. Reused share:
# prompt tokens whose KV was read and not recomputed (the rest is template, question and the
# recomputed ~15%).

# %%
cold_ttft = [r[1].ttft_s for r in rows]
warm_ttft = [r[2].ttft_s for r in rows]
hits = sum(r[2].chunk_hits for r in rows)
chunks = sum(r[2].chunk_hits + r[2].chunk_misses for r in rows)
reused = sum(r[2].reused_tokens for r in rows) / sum(r[2].prompt_tokens for r in rows)
print(f"prompt tokens (median): {statistics.median(r[2].prompt_tokens for r in rows)}")
print(f"median TTFT cold {statistics.median(cold_ttft):.2f}s, warm {statistics.median(warm_ttft):.2f}s, "
      f"speed-up x{statistics.median(c / w for c, w in zip(cold_ttft, warm_ttft)):.2f}")
print(f"hit rate {hits}/{chunks} = {hits / chunks:.0%}; reused share of prompt tokens {reused:.0%}")

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(9, 4))
x = range(len(rows))
ax.bar([i - 0.2 for i in x], cold_ttft, width=0.4, label="full prefill (recompute_ratio=1.0)")
ax.bar([i + 0.2 for i in x], warm_ttft, width=0.4, label="cacheblend (warmed KV)")
ax.set_xticks(list(x), [f"Q{i + 1}" for i in x])
ax.set_ylabel("time to first token (s)")
ax.set_title(f"LlamaIndex query engine over FAISS, SmolLM2-135M on CPU; hit rate {hits / chunks:.0%}")
ax.legend()
fig.tight_layout()
plot_path = OUT / "llamaindex_ttft.png"
fig.savefig(plot_path, dpi=120)
print(f"saved {plot_path}")
