"""Content-addressed keys: the model fingerprint and chunk keys. Never Python ``hash()``.

A chunk key is sha256 over (fingerprint, layout version, variant, the chunk's token ids); the
variant is empty except for a chunk's ``lead`` record (its KV warmed alone, kept beside the KV
warmed behind neighbours for a prompt's first chunk), so plain keys are those of every earlier
version. The fingerprint
covers everything that changes a chunk's KV: model config and weights, tokenizer, compute and KV
dtypes, the context tokens each chunk is computed behind, and how many similar passages it is
computed behind (``BlendConfig.neighbours``; which ones depends on the corpus it was warmed in,
so a chunk warmed into two corpora sharing one store keeps the first one's KV, as good a start
for the blend as any). Keys are independent of where and in which order a chunk appears in a
prompt.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NewType

import torch

from .record import LAYOUT_VERSION

Fingerprint = NewType("Fingerprint", str)
ChunkKey = NewType("ChunkKey", str)

_SAMPLES_PER_TENSOR = 4096


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name, shape, dtype and an evenly strided sample of its values.

    A sample keeps this well under a second for large models while still telling apart two
    checkpoints of one architecture (fine-tunes change nearly every value).
    """
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // _SAMPLES_PER_TENSOR)
        sample = flat[::step][:_SAMPLES_PER_TENSOR].float().cpu().contiguous()
        h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 over the tokenizer's vocabulary and special tokens."""
    h = hashlib.sha256()
    vocab = sorted(tokenizer.get_vocab().items())
    h.update(json.dumps(vocab, ensure_ascii=False).encode())
    h.update(json.dumps(sorted(map(str, tokenizer.all_special_tokens))).encode())
    return h.hexdigest()


def model_fingerprint(
    model: torch.nn.Module,
    tokenizer: Any,
    *,
    kv_dtype: str,
    context_ids: Sequence[int],
    neighbours: int = 0,
) -> Fingerprint:
    """The fingerprint every chunk key of this model and setting is derived from.

    ``neighbours``: how many similar passages each chunk is warmed behind (0: alone; then the
    fingerprint is the one of every earlier version, so existing stores stay valid)."""
    parts = {
        "config": _stable_config(model.config),
        "weights": weights_digest(model),
        "tokenizer": tokenizer_digest(tokenizer),
        "compute_dtype": str(next(model.parameters()).dtype),
        "kv_dtype": kv_dtype,
        "context": list(map(int, context_ids)),
        "layout": LAYOUT_VERSION,
    }
    if neighbours:
        parts["neighbours"] = int(neighbours)
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return Fingerprint(hashlib.sha256(blob).hexdigest())


def _stable_config(config: Any) -> dict:
    """The config minus what varies with where or how the same weights were loaded."""
    volatile = {"transformers_version", "dtype", "torch_dtype", "quantization_config", "architectures"}
    return {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k not in volatile}


LEAD = "lead"  # the variant of a chunk's KV computed behind the chunk context alone (see chunk_key)


def chunk_key(fingerprint: Fingerprint, ids: Sequence[int], variant: str = "") -> ChunkKey:
    """sha256 over the fingerprint, the layout version, the variant and the chunk's token ids (int32 LE).

    ``variant`` names a second record of the same chunk under the same fingerprint: ``"lead"`` is
    its KV computed behind the chunk context alone, kept by engines that warm behind neighbours for
    the prompt's first chunk (``BlendConfig.lead_alone``). The plain key (no variant) is unchanged."""
    h = hashlib.sha256()
    h.update(fingerprint.encode())
    h.update(f"|layout={LAYOUT_VERSION}|".encode())
    if variant:
        h.update(f"variant={variant}|".encode())
    h.update(torch.tensor(list(ids), dtype=torch.int32).numpy().astype("<i4").tobytes())
    return ChunkKey(h.hexdigest())


@dataclass(frozen=True)
class RecordKeys:
    """The store keys of a chunk's records under one fingerprint: its KV as warmed (behind
    neighbours, if any), and with ``lead_alone`` its KV warmed alone for the prompts it leads."""

    fingerprint: Fingerprint
    lead_alone: bool = False

    def __call__(self, ids: Sequence[int]) -> tuple[ChunkKey, ChunkKey | None]:
        plain = chunk_key(self.fingerprint, ids)
        return plain, chunk_key(self.fingerprint, ids, LEAD) if self.lead_alone else None
