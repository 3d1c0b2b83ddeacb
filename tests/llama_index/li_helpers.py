"""Helpers shared by the LlamaIndex tests (module name prefixed to stay unique on sys.path)."""

from __future__ import annotations

from pathlib import Path

import torch
from li_corpus import DOCUMENTS
from llama_index.core import Document
from llama_index.core.node_parser import SentenceSplitter

CHUNK_SIZE = 512  # tokens; every corpus passage stays one node


def splitter() -> SentenceSplitter:
    return SentenceSplitter(chunk_size=CHUNK_SIZE, chunk_overlap=0)


def fresh_documents(tag: str) -> list[Document]:
    """The corpus with a tag in every title: texts no other test has warmed."""
    return [Document(text=d.text, metadata={"title": f"{d.metadata['title']} ({tag})"}) for d in DOCUMENTS]


def kv_files(root: Path) -> dict[str, int]:
    """Every KV file under ``root`` -> its mtime in ns (to prove nothing was rewritten)."""
    return {str(p): p.stat().st_mtime_ns for p in Path(root).rglob("*.safetensors")}


def answer_fidelity(reference, candidate, answer_ids: list[int]) -> tuple[float, float]:
    """(top-1 agreement, mean KL(reference || candidate)) over a reference answer, teacher forced.

    ``reference`` and ``candidate`` are ``Prefilled`` prompts (``engine.prefill``). Every answer
    position is scored under the same prefix (the reference answer so far), so one early flip
    does not make the rest of the comparison meaningless, unlike free-running greedy texts.
    """
    p = reference.continuation_logits(answer_ids)[: len(answer_ids)].log_softmax(-1)  # [T, vocab]
    q = candidate.continuation_logits(answer_ids)[: len(answer_ids)].log_softmax(-1)
    agreement = (q.argmax(-1) == torch.tensor(answer_ids)).float().mean().item()
    kl = (p.exp() * (p - q)).sum(-1).mean().item()
    return agreement, kl
