"""What a run file says about its run: the command, the git commit of the code that ran, the
date, the model and how loaded the machine was (benchmarks/README.md has the convention).

One implementation for ``benchmarks/`` (through ``benchmarks/runfile.py``) and the ``cacheblend``
command's ``--run-file`` outputs. Nothing here imports torch: a script's ``--help`` must exit
before any heavy import; torch's version and threads are recorded only when the run loaded it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..files import write_atomic

HERE = Path(__file__).resolve().parent  # inside the checkout whose commit a run records


def git(*args: str) -> str | None:
    """``git -C <this checkout> args``'s output, or None (not a checkout, no git)."""
    try:
        out = subprocess.run(["git", "-C", str(HERE), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not on this platform
        return None


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
    def start(cls, command: str, model: str | None = None) -> RunRecord:
        status = git("status", "--porcelain", "--untracked-files=no")
        return cls(
            command=command, model=model, commit=git("rev-parse", "HEAD"),
            dirty=None if status is None else bool(status), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            started=time.monotonic(), load_start=load_average(),
        )

    def meta(self) -> dict:
        """The ``run`` entry of a run file, with the end state taken now."""
        machine = {"cpu_count": os.cpu_count(), "load_start": self.load_start, "load_end": load_average(),
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
        text = json.dumps({"run": self.meta(), **payload}, indent=2, default=str) + "\n"
        path = write_atomic(path, text.encode("utf-8"), prefix=f".{Path(path).name}.")
        print(f"wrote run file {path}", flush=True)
        return path
