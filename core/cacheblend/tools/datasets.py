"""Corpora for the demo and the benchmark.

- ``pydoc_passages``: the Python language reference topics that ship with every CPython
  (``pydoc_data.topics``), split on paragraph boundaries into passages of about ``max_tokens``.
  Real technical prose, offline, the same on every machine.
- ``load_musique``: a MuSiQue-format JSON (a list of {question, answers, ctxs: [{title, text}]}),
  such as the 150-question set the CacheBlend authors evaluated on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Passage:
    title: str
    text: str


@dataclass(frozen=True)
class QAExample:
    question: str
    answers: list[str]
    passages: list[str]


def pydoc_passages(count_tokens: Callable[[str], int], max_tokens: int = 512, min_tokens: int = 0) -> list[Passage]:
    """The pydoc topics as passages of at most ~``max_tokens`` tokens and at least ``min_tokens``,
    in a stable order (the benchmarks take 384 of 512: the passages the packer filled at least
    three quarters)."""
    from pydoc_data.topics import topics

    passages = []
    for title in sorted(topics):
        for text in pack_paragraphs(topics[title], count_tokens, max_tokens):
            if not min_tokens or count_tokens(text) >= min_tokens:
                passages.append(Passage(title, text))
    return passages


def pack_paragraphs(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    """Greedily joins paragraphs while the result stays within ``max_tokens``; long paragraphs
    are cut by lines, then kept whole if a single line is still too long."""
    paragraphs = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
    out: list[str] = []
    current: list[str] = []
    for para in paragraphs:
        pieces = [para] if count_tokens(para) <= max_tokens else para.split("\n")
        for piece in pieces:
            trial = "\n\n".join([*current, piece])
            if current and count_tokens(trial) > max_tokens:
                out.append("\n\n".join(current))
                current = [piece]
            else:
                current.append(piece)
    if current:
        out.append("\n\n".join(current))
    return [p for p in (x.strip() for x in out) if p]


def pydoc_workload(
    passages: list[Passage], n_prompts: int, chunks_per_prompt: int = 6, seed: int = 0
) -> list[QAExample]:
    """Prompts of ``chunks_per_prompt`` distinct passages in random order, each asking about one
    of its passages' topics. Answers are judged against full prefill (no gold answers)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n_prompts):
        chosen = rng.sample(passages, chunks_per_prompt)
        target = rng.choice(chosen)
        question = f"According to the documentation above, what is '{target.title}' and how is it used?"
        out.append(QAExample(question, [], [p.text for p in chosen]))
    return out


def load_musique(path: str | Path, chunks_per_prompt: int | None = None) -> list[QAExample]:
    """MuSiQue-format examples; passages are titled as "title\\n text" when a title is present."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, list) or not data or not {"question", "answers", "ctxs"} <= set(data[0]):
        raise ValueError(f"{path} is not a MuSiQue-format list of {{question, answers, ctxs}}")
    out = []
    for ex in data:
        ctxs = ex["ctxs"][:chunks_per_prompt] if chunks_per_prompt else ex["ctxs"]
        texts = [(c.get("title") + "\n" if c.get("title") else "") + c["text"] for c in ctxs]
        out.append(QAExample(ex["question"], list(ex["answers"]), [t.strip() for t in texts if t.strip()]))
    return out
