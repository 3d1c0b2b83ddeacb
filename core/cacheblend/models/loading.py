"""Loading a model and its tokenizer, and resolving where and in which dtype it runs.

An alias of the catalogue loads its converted safetensors copy (``bundled.converted_dir``); any
other name goes to transformers as it is, a ``.gguf`` path through ``gguf_file=``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from . import bundled, catalog
from .bundled import load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device")
    if not (str(device) == "cpu" or str(device).startswith("cuda")):
        raise ValueError(f"device must be 'cpu', 'cuda[:N]' or 'auto', got {device!r}")
    return str(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if dtype is None or dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} or 'auto', got {dtype!r}")
    return DTYPES[dtype]


def load_pretrained(model: str, *, device: str, dtype: str | torch.dtype | None) -> tuple[Any, Any]:
    """(model, tokenizer) from a HF id or folder, a ``.gguf`` file, or a catalogue alias
    (``smollm2-135m-instruct``, ``qwen2.5-0.5b-instruct``, ``gemma3-270m``)."""
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if model in catalog.MODELS:
        source, gguf_file = str(bundled.converted_dir(model)), None
    elif model.endswith(".gguf"):
        source, gguf_file = str(Path(model).parent), Path(model).name
    else:
        source, gguf_file = model, None
    hf_model, tokenizer = load_model(source, dtype=torch_dtype, gguf_file=gguf_file)
    return hf_model.to(dev), tokenizer
