"""Every argument of the ``cacheblend`` command: the top-level parser, each subcommand's arguments
(``SUBCOMMANDS``) and the helpers they share (``model_arg``, ``config_args``).

It imports none of the commands' code: ``parser`` is handed the function that runs each
subcommand (cli.py: demo, warm, ask, bench; serving/command.py: serve). A new command is an entry
in ``SUBCOMMANDS`` here and its function in cli.py's ``_parser``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import BlendConfig


DESCRIPTION = """The ``cacheblend`` command: demo, warm, ask, bench.

    cacheblend demo                      index the pydoc corpus, answer questions, warm KV on miss
    cacheblend warm DOCS --dir IDX       a folder of .txt/.md files or a .jsonl ({"text": ...}) into IDX
    cacheblend ask "question" --dir IDX  retrieve from IDX, answer with blending (--compare: vs full prefill)
    cacheblend bench [--dataset musique.json]
    cacheblend serve                     an OpenAI-compatible server (bundled model, 127.0.0.1:8000)
"""

# What ``cacheblend demo`` asks (``--questions N``: the first N).
DEMO_QUESTIONS = [
    "How does the with statement use __enter__ and __exit__?",
    "What happens to an exception raised inside the body of a with statement?",
    "When are default parameter values of a function evaluated?",
    "What does a yield expression do inside a generator function?",
    "How does the for statement iterate over a sequence or iterator?",
    "How does a try statement with a finally clause behave?",
]

DEFAULT_STORE = Path("~/.cache/cacheblend/serve-store")  # serve --store's default

DEMO_DIR_HELP = " (default .cacheblend/demo; another model: .cacheblend/demo-MODEL)"

Command = Callable[[argparse.Namespace], int]


def parser(commands: Mapping[str, Command]) -> argparse.ArgumentParser:
    """The ``cacheblend`` parser; ``commands``: each subcommand's name -> the function that runs it
    (``args.func`` after parsing)."""
    if set(commands) != set(SUBCOMMANDS):
        raise TypeError(f"commands {sorted(commands)} do not match the subcommands {sorted(SUBCOMMANDS)}")
    p = argparse.ArgumentParser(prog="cacheblend", description=DESCRIPTION,
                                formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(required=True, metavar="COMMAND")
    for name, (summary, add_arguments) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=summary)
        add_arguments(sp)
        sp.set_defaults(func=commands[name])
    return p


def demo_dir(model: str) -> Path:
    """The demo's index for ``model`` (``demo --dir``'s default): passages are split by its
    tokenizer, so one index per model."""
    from .models.catalog import DEFAULT

    if model == DEFAULT:
        return Path(".cacheblend/demo")
    return Path(".cacheblend") / ("demo-" + "".join(c if c.isalnum() or c in ".-" else "_" for c in model))


def model_arg(sp) -> None:
    """``--model``: a catalogue alias (installed from PyPI, converted once), a HF id/folder or a .gguf."""
    from .models.catalog import DEFAULT as default
    from .models.catalog import MODELS

    sp.add_argument("--model", default=default,
                    help=f"{', '.join(MODELS)} (installed by make; converted once on first use), or a "
                         f"HF id/folder, or a .gguf file (default {default})")


def config_args(sp) -> None:
    """``--neighbours K``: how many similar passages each chunk is warmed behind (BlendConfig.neighbours);
    ``--doubt-margin M``: the doubt gate (BlendConfig.doubt_margin); ``--selector S``: which reused tokens
    are recomputed (BlendConfig.selector). None keeps the model's; ``blend_config`` reads them."""
    from .config import SELECTORS, BlendConfig

    default = BlendConfig().neighbours
    sp.add_argument("--selector", choices=SELECTORS, default=None, metavar="NAME",
                    help="which reused tokens are recomputed (default: the model's; SmolLM2's draft+gap drafts 8 "
                         "tokens first, which short prompts feel most: deviation is CacheBlend's, faster there). "
                         "Another selector than the model's runs at the fixed ratio, without the model's "
                         f"adaptive budget. One of: {', '.join(SELECTORS)}")
    sp.add_argument("--neighbours", type=int, default=default,
                    help=f"warm each chunk behind its K most similar passages (default {default}; 0: alone)")
    sp.add_argument("--doubt-margin", type=float, default=None, metavar="M",
                    help="the doubt gate: where the answer's next token is this unsure (its probability above the "
                         "runner-up's by less than M), prefill the prompt in full and decode on from there "
                         "(default: the model's; 0: off; docs/DOUBT-GATE.md)")


def blend_config(args: argparse.Namespace) -> BlendConfig:
    """The ``BlendConfig`` of a command's ``config_args`` flags for its ``--model``."""
    from .config import BlendConfig

    return BlendConfig.for_model(args.model, neighbours=args.neighbours, doubt_margin=args.doubt_margin,
                                 selector=args.selector)


def _index_args(sp, demo: bool = False) -> None:
    """What demo, warm and ask share: the model, and the index directory and how it is built."""
    model_arg(sp)
    sp.add_argument("--device", default="auto")
    sp.add_argument("--dir", required=not demo, help=f"index directory{DEMO_DIR_HELP if demo else ''}")
    sp.add_argument("--max-tokens", type=int, default=512, help="passage size when splitting documents")
    config_args(sp)


def _warm_limit(sp, default: int | None) -> None:
    said = "none" if default == 0 else "all"
    sp.add_argument("--warm-limit", type=int, default=default, metavar="N",
                    help=f"warm the KV of at most the first N passages when indexing (default: {said}); the "
                         "others are warmed on miss, after the first answer that retrieves them")


def _demo(d) -> None:
    _index_args(d, demo=True)
    _warm_limit(d, 0)
    d.add_argument("--top-k", type=int, default=6)
    d.add_argument("--ratio", type=float, default=None)
    d.add_argument("--questions", type=int, default=len(DEMO_QUESTIONS))
    d.add_argument("--run-file", default=None, metavar="JSON",
                   help="also write the run's timings as JSON: model load, embedding, warming, each answer's TTFT")


def _warm(w) -> None:
    w.add_argument("source", help="a folder of .txt/.md files, or a .jsonl file with a 'text' field")
    _index_args(w)
    _warm_limit(w, None)
    w.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="warm on Ray (pip install 'cacheblend[ray]'): a cluster address ('auto', 'host:6379', "
                        "'ray://host:10001') or 'local' (a Ray of workers x threads CPUs started here); records "
                        "byte-identical to warming in this process (docs/RAY.md)")
    w.add_argument("--ray-workers", type=int, default=2, metavar="N", help="Ray actors, one engine each (default 2)")
    w.add_argument("--ray-threads", type=int, default=1, metavar="T", help="torch threads per actor (default 1)")
    w.add_argument("--store", default=None, metavar="LOCATION",
                   help="with --ray: the store every worker writes, a folder they all reach or a Redis URL "
                        "(default: the index's own store, DIR/cacheblend)")


def _ask(a) -> None:
    a.add_argument("question")
    _index_args(a)
    a.add_argument("--top-k", type=int, default=6)
    a.add_argument("--ratio", type=float, default=None)
    a.add_argument("--max-new-tokens", type=int, default=128)
    a.add_argument("--compare", action="store_true", help="also run a full prefill and compare")


def _bench(b) -> None:
    model_arg(b)
    b.add_argument("--device", default="auto")
    b.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or auto (default: the device's)")
    b.add_argument("--dataset", help="a MuSiQue-format JSON (default: prompts over the pydoc corpus)")
    b.add_argument("--prompts", type=int, default=12, help="number of prompts (MuSiQue: first N examples)")
    b.add_argument("--start", type=int, default=0, help="first example (MuSiQue)")
    b.add_argument("--chunks", type=int, default=6)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--ratios", default="0.05,0.15,0.30")
    b.add_argument("--answer-tokens", type=int, default=32, help="greedy answer length for the quality columns")
    b.add_argument("--out", default="bench_out")
    b.add_argument("--store", default=None,
                   help="KV store directory (default: OUT/store; the chunks warmed alone, for CacheBlend's rows, "
                        "go to STORE-alone)")
    config_args(b)


def _serve(s) -> None:
    model_arg(s)
    s.add_argument("--device", default="auto")
    s.add_argument("--store", default=str(DEFAULT_STORE),
                   help=f"KV store: a directory (disk), a Redis URL (redis://host:port/db, shared by every "
                        f"replica attached to it), or 'none' for memory only (default {DEFAULT_STORE})")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    s.add_argument("--port", type=int, default=8000,
                   help="TCP port (default 8000; 0: a free one, named in the 'serving ... on URL' line it prints)")
    s.add_argument("--api-key", default=os.environ.get("CACHEBLEND_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default $CACHEBLEND_API_KEY)")
    s.add_argument("--served-model-name", default=None, help="the model name clients send (default: --model)")
    s.add_argument("--max-batch", type=int, default=8, help="sequences decoded together")
    s.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429")
    s.add_argument("--max-prefill-tokens", type=int, default=4096,
                   help="tokens the prefills between two decode steps may compute (at least one request "
                        "is admitted); waiting requests are admitted until it is spent (default 4096)")
    s.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    s.add_argument("--store-max-gib", type=float, default=None, metavar="GIB",
                   help="bound a folder --store to this many GiB (recency and popularity decide what stays; a Redis "
                        "server bounds itself: maxmemory with maxmemory-policy allkeys-lfu)")
    s.add_argument("--no-warm-on-miss", dest="warm_on_miss", action="store_false",
                   help="warm a request's unseen documents before its prefill instead of when the server is "
                        "idle after it (default: warm on miss; see cacheblend.warm_on_miss)")
    config_args(s)


# name -> (its line in ``cacheblend --help``, what adds its arguments), in the order --help lists them
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "demo": ("index the pydoc corpus, answer questions, warm their passages' KV on miss", _demo),
    "warm": ("index documents and warm their KV into the directory's store", _warm),
    "ask": ("answer a question over an index with blending", _ask),
    "bench": ("TTFT and quality: full prefill, prefix caching, full reuse, CacheBlend", _bench),
    "serve": ("an OpenAI-compatible server with blending and continuous batching", _serve),
}
