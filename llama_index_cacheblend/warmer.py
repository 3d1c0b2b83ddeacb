"""KVCacheWarmer: an ingestion transform that computes each node's KV cache at indexing time.

What it warms is exactly what LlamaIndex later puts into prompts: ``node.get_content(
MetadataMode.LLM)`` (the metadata header as the node's templates render it, then the text). At
query time the engine finds that text in the prompt and reuses its KV. If the text differs (a
template changed, a synthesizer truncated the node), it is not found and is computed: slower,
never wrong.

Use it as the LAST transformation, after splitters and metadata extractors:

    pipeline = IngestionPipeline(transformations=[SentenceSplitter(), embed_model, KVCacheWarmer()])
    index = VectorStoreIndex.from_documents(docs, transformations=[SentenceSplitter(), KVCacheWarmer()])
    index.insert(doc)  # runs the index's transformations again, so the new nodes are warmed too

``IngestionPipeline`` caches a transformation's output under a hash of the input nodes and the
transform's *public* fields (private attributes are ignored). The warmer therefore carries the
engine's ``fingerprint`` (model weights, tokenizer, KV dtype, chunk context) and ``kv_location``
(the store directory, or this process's memory) as public fields: a cache entry written for
another model, another store or another process's memory does not match, and the warmer runs.
The pipeline hashes nodes by their ``MetadataMode.ALL`` content, so a change that alters only the
LLM text (``excluded_llm_metadata_keys``) still hits the cache and skips
the warmer: those nodes are computed at query time (correct, slower) until ``warmer.warm(nodes)``
or a run with the cache disabled.
"""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cacheblend
from cacheblend.integrations import WarmCap, warm_fitting
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.schema import BaseNode, MetadataMode, TransformComponent

from .llm import state_without_engine

if TYPE_CHECKING:  # the engine (and torch) load with the first model, not with this package
    from cacheblend import BlendEngine

# Identifies this process's memory store in cache keys (a constant, never mutated).
_PROCESS_MEMORY = f"memory:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class SkippedNodeWarning(UserWarning):
    """Nodes without text were left unwarmed (they put no text into prompts to reuse)."""


def llm_texts(nodes: Iterable[BaseNode], *, strict: bool = False) -> list[str]:
    """The prompt text of every node that has one: ``get_content(MetadataMode.LLM)``.

    Nodes whose LLM text is empty or whitespace (an empty chunk, an image node without caption or
    metadata, an audio node) have nothing to reuse: they are skipped with a ``SkippedNodeWarning``,
    or rejected with a ValueError naming them when ``strict``. An image node's caption and metadata
    are text and are warmed; its pixels are not (the model reads text only).
    """
    texts, skipped = [], []
    for node in nodes:
        text = node.get_content(metadata_mode=MetadataMode.LLM)
        if isinstance(text, str) and text.strip():
            texts.append(text)
        else:
            skipped.append(f"{type(node).__name__}({node.node_id})")
    if skipped and strict:
        raise ValueError(f"{len(skipped)} node(s) have no text to warm: {', '.join(skipped[:5])}")
    if skipped:
        warnings.warn(f"skipped {len(skipped)} node(s) without text: {', '.join(skipped[:5])}", SkippedNodeWarning, 2)
    return texts


class KVCacheWarmer(TransformComponent):
    """Warms the KV of every node's prompt text; returns the nodes unchanged (no metadata added).

    Idempotent: chunks already in memory or in ``store_dir`` cost nothing. ``store_dir`` (for a
    persisted index: ``<persist_dir>/cacheblend``, see ``storage.kv_store_dir``) keeps the KV on
    disk in safetensors files and is attached to the shared engine at construction, so an LLM
    of the same model finds it even when the pipeline's cache skips this transform.
    """

    model: str = Field(default=cacheblend.BUNDLED_MODEL, description="Model whose KV is computed (as CacheBlendLLM.model).")
    device: str = Field(default="auto", description="'cpu', 'cuda[:N]' or 'auto'.")
    dtype: str | None = Field(default=None, description="Compute dtype; None: fp32 on CPU, bf16 on CUDA.")
    store_dir: str | None = Field(default=None, description="Disk KV store directory; None keeps KV in memory only.")
    strict: bool = Field(default=False, description="Raise on nodes without text instead of skipping them.")
    fingerprint: str = Field(
        default="", description="Engine fingerprint (computed; part of the pipeline cache key)."
    )
    kv_location: str = Field(
        default="", description="Where the KV lives: the store directory or this process's memory (computed)."
    )
    batch_size: int = Field(default=8, gt=0, exclude=True, description="Chunks encoded per forward pass.")
    show_progress: bool | None = Field(
        default=None, exclude=True, description="Progress bar; None shows it from 16 chunks to compute."
    )

    warm_limit: int | None = Field(
        default=None, ge=0, exclude=True,
        description="Warm only the first N nodes (0: none); the others are warmed on miss (WarmCap).",
    )

    _engine: BlendEngine = PrivateAttr()
    _cap: WarmCap = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("fingerprint", None)  # always recomputed from the engine actually loaded
        kwargs.pop("kv_location", None)
        super().__init__(**kwargs)
        self._engine = cacheblend.shared_engine(self.model, device=self.device, dtype=self.dtype)
        self.fingerprint = self._engine.kv.fingerprint
        if self.store_dir is not None:
            self.store_dir = str(Path(self.store_dir).resolve())
            self._engine.attach_store(self.store_dir)
        self.kv_location = f"disk:{self.store_dir}" if self.store_dir else _PROCESS_MEMORY
        self._cap = WarmCap(self.warm_limit)

    def __getstate__(self) -> dict[str, Any]:
        """Settings only: an IngestionPipeline with num_workers > 1 pickles its transforms, and each
        worker process gets its own engine back from them (use ``store_dir`` then: KV computed
        in a worker's memory is lost with the worker)."""
        return state_without_engine(self)

    @classmethod
    def class_name(cls) -> str:
        return "KVCacheWarmer"

    @property
    def engine(self) -> BlendEngine:
        return self._engine

    def warm(self, nodes: Sequence[BaseNode]) -> list[str]:
        """Warms ``nodes`` (e.g. nodes given to ``index.insert_nodes``); returns the chunk keys of
        those warmed. Short texts are skipped, and over-long ones with a warning (never the batch):
        see ``cacheblend.integrations.warm_fitting``."""
        texts = self._cap.split(self._engine, llm_texts(nodes, strict=self.strict))
        return warm_fitting(
            self._engine, texts, store_dir=self.store_dir, batch_size=self.batch_size, progress=self.show_progress
        )

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        self.warm(nodes)
        return nodes

    async def acall(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        await asyncio.to_thread(self.warm, nodes)
        return nodes
