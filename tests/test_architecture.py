"""The shape of the code (docs/ARCHITECTURE.md): no import cycle in the three packages (imports
under ``TYPE_CHECKING`` count), no module over 300 lines, no public function with more than six
parameters. Read from the source with ``ast``: nothing is imported."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"cacheblend": ROOT / "core" / "cacheblend", "langchain_cacheblend": ROOT / "langchain_cacheblend",
            "llama_index_cacheblend": ROOT / "llama_index_cacheblend"}
MAX_LINES, MAX_PARAMS = 300, 6


def modules() -> dict[str, Path]:
    out = {}
    for folder in PACKAGES.values():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder.parent).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = modules()


def imported(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports anywhere in its source (function bodies and
    TYPE_CHECKING blocks included), its own parent packages left out (importing a submodule
    always runs them first: that is not a cycle)."""
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            deps.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - (0 if path.name == "__init__.py" else 1)]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            deps.add(target)
            deps.update(f"{target}.{a.name}" for a in node.names)
    return {d for d in deps if d in MODULES and d != name and not name.startswith(d + ".")}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {m: imported(m, p) for m, p in MODULES.items()}
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_cycle(tmp_path, monkeypatch):
    """The cycle finder on a made-up package: a -> b -> a is found, a TYPE_CHECKING import included."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import thing\n")
    monkeypatch.setattr(__import__(__name__), "MODULES", {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py"})
    assert cycles() == [["pkg.a", "pkg.b"]]


def test_no_import_cycle():
    assert cycles() == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_300_lines(name):
    assert len(MODULES[name].read_text().splitlines()) <= MAX_LINES


def test_no_public_function_with_more_than_six_parameters():
    wide = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                a = node.args
                params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                if len(params) > MAX_PARAMS:
                    wide.append(f"{name}.{node.name}: {len(params)}")
    assert wide == []
