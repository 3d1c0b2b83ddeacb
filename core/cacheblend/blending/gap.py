"""The gap between a chunk's two records: how much a reused row's V depends on what precedes it.

With lead records (``BlendConfig(lead_alone=True)``, the default) every chunk is stored twice: its
lead record, warmed behind the chunk context alone, and its record warmed behind its most similar
passage, which the prompt's chunks after the first read. A row whose V moves between those two
contexts depends on what precedes it; in a prompt, where other passages precede it, it is among the
likeliest rows to be stale. The gap measures that move with no forward pass, from the records
alone: per row, its two records' squared V distance at each layer, divided by that layer's mean
squared V norm over the prompt's reused rows (of the lead records: no layer's scale decides),
summed over the layers.

``selector="draft+gap"`` multiplies the draft's score by it (``draft.DraftSelector``): a stale row
changes the answer by about the attention the answer pays it times the error of its V, so the pick
is the rows the answer reads *and* whose records disagree (docs/RECORD-GAP.md measures it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..stores import ChunkRecord

Place = tuple[int, list[int], list[int]]  # a chunk read: its index among the chunks, its prompt rows, its chunk rows


def record_gap(places: Sequence[Place], records: Sequence[ChunkRecord | None], leads: Sequence[ChunkRecord | None],
               n: int) -> torch.Tensor | None:
    """[N] fp32: each prompt row's gap (the module docstring), 0 where no record covers it and on a
    chunk that reads its lead record (the prompt's first: nothing but the head precedes it, as in
    full prefill). ``places``: the chunks read, in prompt order (``Assembled.places``);
    ``records``: what each chunk reads, ``leads``: each chunk's lead record (its other record where
    it has none), both per chunk. None when there is nothing to compare: no chunk read, or a chunk
    after the first without a lead record of its own (an engine warming alone, or a lead record
    missing from every tier); the draft's score is then used alone."""
    pairs = [(rows, cols, records[i], leads[i]) for i, rows, cols in places]
    if not pairs or any(j and (lead is None or read.key == lead.key) for j, (_, _, read, lead) in enumerate(pairs)):
        return None
    device = pairs[0][2].kv.device
    moved, norms, count = [], 0.0, 0
    for rows, cols, read, lead in pairs:
        index = torch.tensor(cols, device=device)
        a = read.kv[:, 1].index_select(2, index).float()  # V [layers, kv_heads, rows, d]
        b = (lead or read).kv[:, 1].index_select(2, index).float()
        moved.append((a - b).pow(2).sum((1, 3)))  # [layers, rows]
        norms, count = norms + b.pow(2).sum((1, 2, 3)), count + len(cols)  # [layers], summed over rows
    scale = (norms / count).clamp_min(1e-12)  # [layers]: mean squared V norm per row
    gap = torch.zeros(n, dtype=torch.float32, device=device)
    for (rows, _, _, _), d in zip(pairs, moved):
        gap[torch.tensor(rows, device=device)] = (d / scale[:, None]).sum(0)
    return gap
