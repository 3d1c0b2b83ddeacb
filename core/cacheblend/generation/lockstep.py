"""Answers decoded in lockstep: each step is ONE forward for every unfinished answer (``SlotKV.step``),
then each answer picks its own next token (its sampling, EOS, stop strings, length, doubt gate).

This is the package's one decode loop: the engine's shared batch (``shared.SharedDecode``) runs it
for every stream and for ``BlendEngine.generate_many``'s prefills, the server's scheduler for the
requests it has admitted. On a CPU a decode step of one answer reads every weight to compute one
row, so its time is the memory's, not the arithmetic's: answers stepped together share that read.

An answer takes a slot (a copy of its prompt's KV) only after its first token is picked, so the
copy is never on the first token's path, and an answer that ends at its first token takes none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..models.adapter import ModelAdapter
from ..result import BlendStats, Generation
from .batch import SlotKV
from .decode import Decoding, Prefilled, Sampling, TextTracker


@dataclass
class Answer:
    """One answer being decoded: the text so far, how it picks, and its stats (its prefill's, then
    the doubt gate's second prefill's when that fires; ``ttft_s`` and ``total_s`` from ``started``)."""

    tracker: TextTracker
    sampling: Sampling
    generator: torch.Generator | None
    limit: int  # at most this many tokens (max_new_tokens, or what the context window leaves)
    stats: BlendStats
    started: float  # time.perf_counter() its TTFT and total time count from
    gated: Prefilled | None = None  # the prefill whose doubt gate may still fire (None: no gate, or it fired)
    next_token: int = -1
    done: bool = False
    tag: Any = None  # the caller's own (the scheduler's job)

    @classmethod
    def of(cls, pre: Prefilled, decoding: Decoding, tokenizer: Any, window: int, started: float,
           tag: Any = None) -> Answer:
        """The answer to decode after ``pre``: at most ``decoding.max_new_tokens`` tokens and what
        the context ``window`` leaves."""
        sampling = decoding.sampling
        return cls(TextTracker(tokenizer, list(decoding.stop)), sampling, sampling.generator(pre.output.logits.device),
                   min(decoding.max_new_tokens, window - len(pre.ids)), replace(pre.stats, finish_reason="length"),
                   started, pre if pre.doubt is not None else None, tag=tag)

    @property
    def generation(self) -> Generation:
        return Generation(self.tracker.text, self.stats, self.tracker.ids)


class Lockstep:
    """Up to ``slots`` answers decoding together over one ``SlotKV``; see the module docstring.
    ``on_redo(stats)`` hears of every second prefill the doubt gate makes (the server's metrics)."""

    def __init__(self, adapter: ModelAdapter, slots: int, eos_ids: set[int],
                 on_redo: Callable[[BlendStats], None] | None = None) -> None:
        self.kv = SlotKV(adapter, slots)
        self.eos_ids = eos_ids
        self.on_redo = on_redo
        self.active: list[Answer] = []  # active[i] decodes in slot i
        self.forward_s = 0.0  # the last step's batched forward alone (no picks, no doubt-gate redo)

    @property
    def free(self) -> int:
        return self.kv.slots - len(self.active)

    def first(self, answer: Answer, pre: Prefilled) -> tuple[str, Prefilled]:
        """Picks ``answer``'s first token from ``pre``'s logits, after its doubt gate looks; touches
        no slot, so it may run while another thread steps the batch. Returns the text it made safe
        and the prefill to seat (the gate's second one when it fired)."""
        if answer.limit <= 0:  # the prompt fills the context window: nothing can be decoded
            return self._finish(answer, "length"), pre
        logits = pre.output.logits
        if answer.gated is not None and pre.doubt.doubts(logits):  # in doubt at the first token
            pre, logits = self._redo(answer, None)
        return self._pick(answer, logits), pre

    def verify_draft(self, answer: Answer, pre: Prefilled) -> tuple[str, Prefilled]:
        """A draft selector's draft (``BlendOutput.draft``: full reuse's greedy answer) as the answer's
        next tokens, verified in one forward. Where the blend changed little the blended answer
        begins with the draft (5.4 of its 8 tokens on average on SmolLM2's MuSiQue and pydoc prompts), and
        decoding them costs a step each, a read of every weight. When the first pick is the draft's
        first token, its row and the rest of the draft's are computed at once (``Prefilled.fed``),
        and each pick is taken from the row before it while the picks agree with the draft: the
        tokens greedy decoding gives, up to the fp32 round-off of a batched product, with the pick
        after the last agreeing row for free (prompt lookup decoding's verification). Greedy
        answers without a doubt gate only (a sampled token needs its own distribution; the gate
        reads every step's). ``BlendStats.draft_verified``: the picks taken from that forward. Runs
        after ``first``, whose piece the caller emits first (the forward is not on the first token's
        path), and before ``seat``, which it hands the prefill to seat: its own when nothing is
        verified, else it with the verified tokens' K/V. Returns the text it made safe too."""
        draft, room = pre.output.draft, answer.limit - len(answer.tracker.ids)
        if not draft or answer.done or answer.gated is not None or answer.sampling.temperature \
                or answer.next_token != draft[0]:
            return "", pre
        tokens = [answer.next_token, *draft[1:room]]  # a row per pick the answer still has room for
        logits, caches = pre.fed(tokens)
        pieces, fed = [], 0
        while fed < len(tokens):
            pieces.append(self._pick(answer, logits[fed]))  # the pick after token ``fed``
            fed += 1
            if answer.done or fed == len(tokens) or answer.next_token != tokens[fed]:
                break
        answer.stats.draft_verified = fed
        return "".join(pieces), pre.extended(caches, fed)

    def seat(self, answer: Answer, pre: Prefilled) -> None:
        """Gives ``answer`` (its first token picked) a slot holding ``pre``'s KV; it joins the next step."""
        self.kv.add(pre.output.kv)  # RuntimeError when every slot is taken
        self.active.append(answer)

    def step(self) -> list[tuple[Answer, str]]:
        """One batched forward for every active answer, then each picks its token; the finished ones
        leave the batch. Returns every answer stepped with the text it made safe to emit."""
        started = time.perf_counter()
        logits = self.kv.step([a.next_token for a in self.active])  # [B, vocab]
        self.forward_s = time.perf_counter() - started
        out = []
        for i, answer in enumerate(self.active):
            row = logits[i]
            if answer.gated is not None and answer.gated.doubt.doubts(row):  # decode on from a redo
                _, row = self._redo(answer, i)
            out.append((answer, self._pick(answer, row)))
        self.drop([i for i, a in enumerate(self.active) if a.done])
        return out

    def drop(self, rows: list[int]) -> None:
        """Frees the slots of ``rows`` (finished or cancelled answers)."""
        for i in sorted(rows, reverse=True):  # the last slot moves into i, as in SlotKV.remove
            self.kv.remove(i)
            self.active[i] = self.active[-1]
            self.active.pop()

    def _redo(self, answer: Answer, slot: int | None) -> tuple[Prefilled, torch.Tensor]:
        """The doubt gate fires: the prompt prefilled again (``Prefilled.redone``) and the tokens
        decoded so far fed after it, into ``slot`` when the answer has one. Returns the new prefill
        and the logits of the next pick."""
        again = answer.gated.redone(len(answer.tracker.ids))
        answer.gated, answer.stats = None, replace(again.stats, ttft_s=answer.stats.ttft_s, finish_reason="length")
        one, logits = again.resume(answer.tracker.ids)
        if slot is not None:
            self.kv.put(slot, one.held(0) if one is not None else again.output.kv)
        if self.on_redo is not None:
            self.on_redo(again.stats)
        return again, logits

    def _pick(self, answer: Answer, logits: torch.Tensor) -> str:
        """Samples ``answer``'s next token from ``logits`` [vocab]; returns the text it made safe."""
        token = answer.sampling.pick(logits, answer.generator)
        tracker = answer.tracker
        if answer.next_token < 0:
            answer.stats.ttft_s = time.perf_counter() - answer.started
        answer.next_token = token
        if token in self.eos_ids:
            return self._finish(answer, "stop")
        tracker.push(token)
        if tracker.stopped:
            return self._finish(answer, "stop")
        if len(tracker.ids) >= answer.limit:
            return self._finish(answer, "length")
        return tracker.delta(final=False)

    @staticmethod
    def _finish(answer: Answer, reason: str) -> str:
        stats = answer.stats
        stats.finish_reason, stats.completion_tokens = reason, len(answer.tracker.ids)
        stats.total_s = time.perf_counter() - answer.started
        answer.done = True
        return answer.tracker.delta(final=True)

