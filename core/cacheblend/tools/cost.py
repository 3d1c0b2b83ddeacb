"""What a prefill computes, counted in rows and in multiply-accumulates: the two compute floors.

The row floor counts rows (``prefill_rows``): per layer the rows it computed, the first stage's
too in a two-stage blend; for a one-pass blend that is L / (f + (L - f) s) of full prefill's
(``bench.compute_floor``: L layers, the first f over every token, the others over the recomputed
share s). It takes a row's attention to cost nothing beside its linear weights. But a recomputed
row attends to every key before it, and the question's rows (uncached, at the prompt's end) to all
of them, where full prefill's rows attend to half the prompt on average: the blend keeps a larger
share of the attention than of the rows. ``prefill_macs`` counts both from the rows a prefill
really computed (``BlendOutput.active_rows``):

- linear: per layer, the K and V projections of every row entering the layer (a check layer
  computes them for all its rows, then keeps some) and the layer's other linear weights (Q, O, the
  MLP) for the rows it keeps (``ModelAdapter.linear_macs``: the weights' element counts); the LM
  head for the last row;
- attention: 2 x heads x head_dim per (row, key) pair a row attends (QK and AV): the keys up to
  its position, within the layer's sliding window;
- a two-stage blend's first stage the same way (its LM head included), and the scores it takes of
  the question's attention: heads x head_dim per (question row, key) pair at each scored layer;
  a drafted answer's rows (``blending/draft.py``) each as a row of every layer of that stage, with
  its layer-0 K/V and its LM head (the rows of guesses a drafting pass rejected too), and the kept
  rows' scores over the prompt's keys and the draft's.

Not counted: embeddings, norms, RoPE and the softmax (elementwise), and what a blend does besides
computing rows (loading and realigning the cached KV, the selection, copies). The MAC floor of a
method is full prefill's count over its count: its speedup if every multiply-accumulate ran at the
rate full prefill's do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..blending.blend import BlendOutput
from ..models.adapter import ModelAdapter


@dataclass(frozen=True)
class Macs:
    linear: int
    attention: int

    @property
    def total(self) -> int:
        return self.linear + self.attention


def prefill_macs(adapter: ModelAdapter, out: BlendOutput) -> Macs:
    """The multiply-accumulates of the prefill that produced ``out`` (the module docstring)."""
    n = out.kv[0][0].shape[2]  # the prompt's tokens
    per_pair = 2 * adapter.num_heads * adapter.head_dim
    # the scoring, QK only: a drafted row (``blending/draft.py``) over the prompt's keys and the draft's
    attention = (out.question_rows * n + out.drafted ** 2) * per_pair // 2 * len(out.question_layers)
    # every row the drafting passes computed (a rejected guess's too: the first stage's rows past the
    # prompt) adds its layer-0 K/V and its LM head
    drafting = int((out.first_stage_active[0] >= n).sum()) if out.drafted else 0
    linear = drafting * (adapter.linear_macs(0)[0] + adapter.linear_macs(None)[1])
    for stage in (out.first_stage_active, out.active_rows):
        entering, linear = n, linear + (adapter.linear_macs(None)[1] if stage else 0)  # each stage's last row's logits
        for layer, rows in enumerate(stage):
            kv, rest = adapter.linear_macs(layer)
            linear += entering * kv + rows.shape[0] * rest
            attention += key_pairs(rows, adapter.window(layer)) * per_pair
            entering = rows.shape[0]
    return Macs(linear, attention)


def prefill_rows(out: BlendOutput) -> int:
    """The row-layers the prefill that produced ``out`` computed: per layer the rows it kept (every
    row before the first check layer), over both stages of a two-stage blend."""
    return sum(int(rows.shape[0]) for stage in (out.first_stage_active, out.active_rows) for rows in stage)


def key_pairs(rows: torch.Tensor, window: int | None) -> int:
    """(row, key) pairs attended by rows at positions ``rows`` [n] over a prompt's keys: a row at
    position p sees the keys at 0..p, only the last ``window`` of them under a sliding window."""
    keys = rows.long() + 1
    return int((keys if window is None else keys.clamp(max=window)).sum())
