"""Decoding from a prefilled cache: sampling, stop strings, and text streaming.

Decoding is ordinary: each step runs the HF model on one token with the blended cache handed in.
Stop strings may span several tokens; streamed text holds back any tail that could still turn
into a stop string or that ends inside a multi-byte character, so a consumer never sees text
that the final answer does not contain.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy; top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(int(self.seed))

    def pick(self, logits: torch.Tensor, gen: torch.Generator | None) -> int:
        """Next token id from logits [vocab] (fp32)."""
        if self.temperature == 0:
            return int(torch.argmax(logits))
        logits = logits / self.temperature
        if self.top_k:
            kth = torch.topk(logits, min(self.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            drop = torch.cumsum(sorted_p, dim=-1) - sorted_p > self.top_p  # keep the first token always
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=gen))


@dataclass
class TextTracker:
    """Accumulates generated tokens into text; finds stop strings; says what is safe to emit."""

    tokenizer: object
    stop: Sequence[str] = ()
    ids: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    stopped: bool = False

    def push(self, token: int) -> None:
        self.ids.append(token)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for s in self.stop:
            at = self.text.find(s)
            if at >= 0:
                self.text, self.stopped = self.text[:at], True

    def delta(self, final: bool) -> str:
        """Text not yet emitted that can no longer change."""
        end = len(self.text)
        if not final:
            end = self._safe_end()
        if end <= self.emitted:
            return ""
        out, self.emitted = self.text[self.emitted : end], end
        return out

    def _safe_end(self) -> int:
        end = len(self.text)
        while end > self.emitted and self.text[end - 1] == "\ufffd":  # an unfinished UTF-8 sequence
            end -= 1
        for s in self.stop:  # hold back a tail that is a prefix of a stop string
            for k in range(min(len(s) - 1, end), 0, -1):
                if self.text[end - k : end] == s[:k]:
                    end -= k
                    break
        return end


def decode_tokens(step, first_logits: torch.Tensor, sampling: Sampling, max_new_tokens: int) -> Iterator[int]:
    """Yields up to ``max_new_tokens`` token ids; the caller stops at EOS or a stop string.

    ``step(token_id) -> logits`` advances the model by one token; it is called lazily, only when
    the next token is asked for.
    """
    gen = sampling.generator(first_logits.device)
    logits = first_logits
    for i in range(max_new_tokens):
        token = sampling.pick(logits, gen)
        yield token
        if i + 1 < max_new_tokens:
            logits = step(token)
