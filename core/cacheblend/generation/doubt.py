"""The doubt gate (``BlendConfig.doubt_margin``): a budget the answer decides.

A blend is sure of most of an answer's tokens. Where it is not, the likeliest next token's
probability barely exceeds the second's; the blend's answer then often differs from full
prefill's (docs/DOUBT-GATE.md measures how well this predicts it). At such a step the prompt is
prefilled again at ``doubt_ratio`` (a full prefill by default), the tokens already sent are fed
after it, and decoding goes on from that cache: once per request, so a request costs at most two
prefills. The decode loop (``lockstep.Lockstep``: the library's streams, ``generate_many`` and the
server's model thread) fires it through ``Prefilled.redone`` and ``Prefilled.resume``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..blending.draft import token_margins


def top_margin(logits: torch.Tensor) -> float:
    """How sure the model is of its next token: the probability of the likeliest minus the
    second's, from logits [vocab] (pure; ``draft.token_margins`` of one row)."""
    return float(token_margins(logits[None])[0])


@dataclass(frozen=True)
class Doubt:
    """The doubt gate of one prefill (``BlendConfig.doubt_margin``): ``redo()`` prefills the same
    request again at the gate's ``doubt_ratio``; it is called when a step's ``top_margin`` falls
    below ``margin``, once per request (its result has no gate)."""

    margin: float
    redo: Callable[[], Any]  # -> the request's ``decode.Prefilled`` at the gate's ratio, without a gate

    def doubts(self, logits: torch.Tensor) -> bool:
        return top_margin(logits) < self.margin
