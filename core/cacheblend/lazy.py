"""Lazy package attributes (PEP 562): a package's public names load on first use.

``import cacheblend`` and ``import langchain_cacheblend`` then cost no torch, transformers or
FAISS import; the heavy modules load when a name that needs them is first touched.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package named ``package``.

    ``exports`` maps each public name to the module that defines it, relative to the package:
    ``"module"``, or ``"module:attr"`` when the name there differs.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = exports[name].partition(":")
        value = getattr(importlib.import_module(f".{module}", package), attr or name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
