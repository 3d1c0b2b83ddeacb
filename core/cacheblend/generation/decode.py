"""What decoding works with: the prefill result, sampling, stop strings, the decoding options.

Stop strings may span several tokens; streamed text holds back any tail that could still turn
into a stop string or that ends inside a multi-byte character, so a consumer never sees text
that the final answer does not contain. The decode loop itself is ``lockstep.py`` (one batched
forward per step for every answer); ``stream.py`` streams one answer through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from ..blending.blend import BlendOutput
from ..blending.draft import feed
from ..blending.rope import RopeTables
from ..models.adapter import ModelAdapter
from .batch import SlotKV
from .doubt import Doubt
from ..result import BlendStats


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
        # In float64 and shifted by the max: the max's logit is exactly 0 and every other one a finite
        # negative number or -inf, whatever the temperature (in fp32, 1e-61 rounds to 0 and gives 0/0).
        logits = (logits.double() - logits.max().double()) / self.temperature
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


@dataclass
class Prefilled:
    """A prompt after (blended) prefill: per-layer KV, last-token logits, ids and stats."""

    adapter: ModelAdapter
    ids: torch.Tensor
    output: BlendOutput
    stats: BlendStats
    missed: list[str] = field(default_factory=list)  # texts of the chunks no tier held (warm on miss warms them)
    doubt: Doubt | None = None  # the doubt gate (doubt.py), when the config has one and this prefill is below its ratio

    def cache(self) -> Any:
        """A fresh transformers cache over the prompt's KV, safe to extend: decoding appends into
        new tensors and never writes the prompt's KV, so nothing is copied before the first token
        and the same Prefilled can be decoded again."""
        return self.adapter.make_cache(self.output.kv)

    def continuation_logits(self, continuation: Sequence[int]) -> torch.Tensor:
        """Next-token logits [1 + len(continuation), vocab] fp32: after the prompt, then after each
        continuation token (teacher forcing). Used to compare blends with full prefill."""
        return continuation_logits_many([self], continuation)[0]

    def redone(self, step: int) -> Prefilled:
        """The doubt gate at answer step ``step``: the prompt prefilled again (``doubt.redo``), its
        stats saying so (``doubt_step``, ``redone_tokens``: what this prefill had recomputed)."""
        again = self.doubt.redo()
        again.stats = replace(again.stats, doubt_step=step, redone_tokens=self.stats.recomputed_tokens)
        return again

    @torch.inference_mode()
    def fed(self, tokens: Sequence[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``tokens`` after the prompt in one forward (``blending.draft.feed``: every row at once, each
        over the prompt and the tokens before it): the next-token logits after each [m, vocab] fp32,
        and per layer a cache [2,Hkv,N+m,d] holding the prompt's K/V and theirs (a copy: the
        prompt's KV is not written). ``extended`` keeps some of them."""
        n, m = len(self.ids), len(tokens)
        caches = []
        for k, v in self.output.kv:  # [1,Hkv,N,d] each
            cache = k.new_empty((2, k.shape[1], n + m, k.shape[3]))
            cache[0, :, :n], cache[1, :, :n] = k[0], v[0]
            caches.append(cache)
        positions = torch.arange(n, n + m, device=self.ids.device)
        tables = RopeTables.at(self.adapter, torch.arange(n + m, device=self.ids.device))
        logits, _ = feed(self.adapter, caches, list(tokens), positions, tables)
        return logits.float(), caches

    def extended(self, caches: list[torch.Tensor], count: int) -> Prefilled:
        """This prefill with the K/V of the first ``count`` tokens ``fed`` gave ``caches`` after the
        prompt's: what decoding goes on from once those tokens are the answer's."""
        end = len(self.ids) + count
        kv = [(cache[0, :, :end][None], cache[1, :, :end][None]) for cache in caches]
        return replace(self, output=replace(self.output, kv=kv))

    def resume(self, tokens: Sequence[int]) -> tuple[SlotKV | None, torch.Tensor]:
        """A one-slot ``SlotKV`` holding this prompt's KV with ``tokens`` decoded after it (None when
        there are none), and the logits of the step that follows them."""
        if not tokens:
            return None, self.output.logits
        slots = SlotKV(self.adapter, 1)
        slots.add(self.output.kv)
        logits = self.output.logits
        for token in tokens:
            logits = slots.step([token])[0]
        return slots, logits


@torch.inference_mode()
def continuation_logits_many(prefilled: Sequence[Prefilled], continuation: Sequence[int]) -> list[torch.Tensor]:
    """``Prefilled.continuation_logits`` of each prefill along one ``continuation``. Prompts of one
    model and one length share a teacher-forced forward (one read of the weights for all), so a
    measure that compares several blends of a prompt with its full prefill pays about one pass;
    each equals its own pass up to the fp32 round-off of a batched product."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(prefilled):
        groups.setdefault((id(p.adapter.model), len(p.ids)), []).append(i)  # engines may share a model
    out: list[torch.Tensor] = [torch.empty(0)] * len(prefilled)
    n = len(continuation)
    for members in groups.values():
        group = [prefilled[i] for i in members]
        first = group[0]
        if n:
            kv = first.output.kv if len(group) == 1 else [
                (torch.cat([p.output.kv[layer][0] for p in group]), torch.cat([p.output.kv[layer][1] for p in group]))
                for layer in range(len(first.output.kv))
            ]  # per layer [b, Hkv, N, d]
            ids = torch.tensor([list(continuation)] * len(group), device=first.ids.device)
            pos = torch.arange(len(first.ids), len(first.ids) + n, device=ids.device)[None].repeat(len(group), 1)
            cache = first.adapter.make_cache(kv)
            logits = first.adapter.model(input_ids=ids, cache=cache, position_ids=pos, use_cache=True).logits.float()
        for j, (i, p) in enumerate(zip(members, group)):
            head = p.output.logits[None].float()  # after the prompt
            out[i] = torch.cat([head, logits[j]]) if n else head  # then after each continuation token
    return out


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token id that ends a generation: the generation config's, the model config's and the
    tokenizer's EOS (chat models often name several)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        ids.update([value] if isinstance(value, int) else list(value or []))
    return ids


SAMPLING_FIELDS = tuple(f.name for f in fields(Sampling))  # temperature, top_p, top_k, seed


@dataclass(frozen=True)
class Decoding:
    max_new_tokens: int
    sampling: Sampling
    stop: Sequence[str] | None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop", [s for s in (self.stop or []) if s])

    @classmethod
    def of(cls, *, max_new_tokens: int = 256, stop: Sequence[str] | None = None, **sampling: Any) -> Decoding:
        """The decoding of a call's options: ``max_new_tokens``, ``stop`` and the fields of
        ``Sampling``; ValueError naming any other option."""
        unknown = sorted(set(sampling) - set(SAMPLING_FIELDS))
        if unknown:
            known = ", ".join(("max_new_tokens", "stop", *SAMPLING_FIELDS))
            raise ValueError(f"unknown generation option(s) {', '.join(unknown)}; known: {known}")
        return cls(max_new_tokens, Sampling(**sampling), stop)
