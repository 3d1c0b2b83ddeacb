"""Loading a model and its tokenizer, and resolving where and in which dtype it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from . import bundled

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
    """(model, tokenizer) from a HF id or folder, a ``.gguf`` file, or the bundled alias."""
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if model == bundled.ALIAS:
        return load_model(str(bundled.converted_dir()), device=dev, dtype=torch_dtype)
    if model.endswith(".gguf"):
        path = Path(model)
        return load_model(str(path.parent), device=dev, dtype=torch_dtype, gguf_file=path.name)
    return load_model(model, device=dev, dtype=torch_dtype)


def load_model(source: str, *, device: str, dtype: torch.dtype | None, gguf_file: str | None = None) -> tuple[Any, Any]:
    """Loads (model, tokenizer) from a HF id or folder (optionally a GGUF file inside it), offline-safe."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype or torch.float32, **kwargs)
    model.to(device).eval()
    return model, tokenizer


def save_converted(model: Any, tokenizer: Any, target: str) -> None:
    """Saves a GGUF-loaded model as safetensors (``save_pretrained`` refuses GGUF-quantized configs)."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(target)
    tokenizer.save_pretrained(target)
