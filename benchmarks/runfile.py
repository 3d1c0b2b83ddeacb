"""The one place benchmark scripts get their shared flags and write their JSON run files.

A figure in README.md or docs/ stands for a run file committed under docs/runs/ (the convention
is in benchmarks/README.md). A run file says what produced the figure, so that anyone can run
it again and see whether it still holds: the command, the git commit (and whether the working
tree had uncommitted changes), the date, the model, and how loaded the machine was while it ran
(``os.getloadavg()`` at start and end beside the CPU count: on shared CPUs a timing means little
without it). Scripts call ``add_common`` on their parser and ``RunRecord.start(args)`` before
any work, then ``record.write(args.run_file, payload)``; ``payload`` is the script's own result
dict, stored beside a ``run`` key.

Nothing here imports torch: ``--help`` must exit before any heavy import.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

# cacheblend's default model (cacheblend.models.catalog.DEFAULT), spelled out because importing
# cacheblend.models loads torch; tests/test_benchmarks_cli.py checks that the two agree.
DEFAULT_MODEL = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[1]


def add_common(parser: argparse.ArgumentParser, *, model: bool = True, quick: str = "tiny inputs, seconds") -> None:
    """``--model`` (when the script runs a model), ``--quick`` and ``--run-file``: the same flags
    and meanings in every benchmark."""
    if model:
        parser.add_argument("--model", default=DEFAULT_MODEL,
                            help=f"model alias or path, passed to the engine (default {DEFAULT_MODEL})")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run that CI exercises: {quick}")
    parser.add_argument("--run-file", default=None, metavar="JSON",
                        help="write the results with the run's command, commit, date, model and machine load "
                             "(docs/runs/ for figures in the docs: benchmarks/README.md)")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on this platform
        return None


def command_line(argv: list[str] | None = None) -> str:
    """The command as one would type it again from the repository root."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *argv[1:]])


@dataclass
class RunRecord:
    """What a run file says about its run; ``start`` takes it before the work begins."""

    command: str
    model: str | None
    commit: str | None
    dirty: bool | None
    date: str
    started: float
    load_start: list[float] | None
    extra: dict = field(default_factory=dict)

    @classmethod
    def start(cls, args: argparse.Namespace | None = None, argv: list[str] | None = None) -> RunRecord:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return cls(
            command=command_line(argv), model=getattr(args, "model", None), commit=_git("rev-parse", "HEAD"),
            dirty=None if status is None else bool(status), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            started=time.monotonic(), load_start=_load(),
        )

    def meta(self) -> dict:
        """The ``run`` entry of a run file, with the end state taken now."""
        machine = {"cpu_count": os.cpu_count(), "load_start": self.load_start, "load_end": _load(),
                   "platform": platform.platform(), "python": platform.python_version()}
        if hasattr(os, "sched_getaffinity"):
            machine["cpus_usable"] = len(os.sched_getaffinity(0))
        torch = sys.modules.get("torch")
        if torch is not None:  # only when the script used it: never imported here
            machine |= {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
        return {"command": self.command, "commit": self.commit, "dirty": self.dirty, "date": self.date,
                "seconds": round(time.monotonic() - self.started, 1), "model": self.model,
                "machine": machine, **self.extra}

    def write(self, path: str | Path | None, payload: dict) -> Path | None:
        """Writes ``{"run": meta, **payload}`` to ``path`` atomically (None: writes nothing)."""
        if path is None:
            return None
        if "run" in payload:
            raise ValueError("the payload's 'run' key is the run file's own")
        from cacheblend.files import write_atomic  # the package's one atomic writer (no torch import)

        text = json.dumps({"run": self.meta(), **payload}, indent=2, default=str) + "\n"
        path = write_atomic(path, text.encode("utf-8"), prefix=f".{Path(path).name}.")
        print(f"wrote run file {path}", flush=True)
        return path
