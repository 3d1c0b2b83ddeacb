"""Quality measures: how close a blend is to full prefill, and answer F1.

- ``answer_kl``: mean KL(full prefill || blend) of the next-token distributions over the tokens
  of the full-prefill answer (teacher forcing), the distribution-level gap; ``answer_kls`` for
  several blends of one prompt, their passes batched.
- ``token_f1``: SQuAD-style token F1 between two answers (lowercased, punctuation and articles
  dropped), used against gold answers and against the full-prefill answer.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

import torch

from ..generation.decode import Prefilled, continuation_logits_many


def answer_kl(reference: Prefilled, candidate: Prefilled, answer_ids: Sequence[int]) -> float:
    """Mean KL(reference || candidate) over the prompt's last position and each answer token.

    Each term is clamped at 0: KL is never negative, and identical distributions computed along
    different kernels (e.g. the prefix-cache path) give float noise of either sign."""
    return answer_kls(reference, [candidate], answer_ids)[0]


def answer_kls(reference: Prefilled, candidates: Sequence[Prefilled], answer_ids: Sequence[int]) -> list[float]:
    """``answer_kl`` of each candidate, the reference's and the candidates' teacher-forced passes
    batched (``continuation_logits_many``: prompts of one length share one forward)."""
    ref, *rest = continuation_logits_many([reference, *candidates], answer_ids)
    p = torch.log_softmax(ref, dim=-1)  # [T, vocab]
    return [mean_kl(p, torch.log_softmax(q, dim=-1)) for q in rest]


def mean_kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """Mean over rows of KL(p || q), from log-probabilities [T, vocab]; each term clamped at 0
    (``answer_kl``). For callers that already hold the reference's log-probs."""
    return float((p.exp() * (p - q)).sum(-1).clamp_min(0.0).mean())


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def best_f1(prediction: str, answers: Sequence[str]) -> float:
    """The best token F1 against any of the gold answers."""
    return max((token_f1(prediction, a) for a in answers), default=0.0)
