"""The one place benchmark scripts get their shared flags and write their JSON run files.

A figure in README.md or docs/ stands for a run file committed under docs/runs/ (the convention
is in benchmarks/README.md). A run file says what produced the figure, so that anyone can run
it again and see whether it still holds: the command, the git commit (and whether the working
tree had uncommitted changes), the date, the model, and how loaded the machine was while it ran
(``os.getloadavg()`` at start and end beside the CPU count: on shared CPUs a timing means little
without it). Scripts call ``add_common`` on their parser and ``RunRecord.start(args)`` before
any work, then ``record.write(args.run_file, payload)``; ``payload`` is the script's own result
dict, stored beside a ``run`` key.

Nothing here imports torch: ``--help`` must exit before any heavy import. The record itself
(``RunRecord``: what is recorded, and the atomic write) is ``cacheblend.tools.runrecord``'s, which
the ``cacheblend`` command's ``--run-file`` outputs use too.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from cacheblend.tools.runrecord import RunRecord as PackageRunRecord  # no torch import

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


def command_line(argv: list[str] | None = None) -> str:
    """The command as one would type it again from the repository root."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *argv[1:]])


class RunRecord(PackageRunRecord):
    """``cacheblend.tools.runrecord.RunRecord``, started from a script's parsed arguments: the
    command as typed from the repository root, the ``--model`` it ran."""

    @classmethod
    def start(cls, args: argparse.Namespace | None = None, argv: list[str] | None = None) -> RunRecord:
        return super().start(command_line(argv), getattr(args, "model", None))
