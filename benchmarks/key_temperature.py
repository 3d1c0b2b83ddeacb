"""APE's attention temperature on the reused keys, measured against the same blends without it.

    .venv/bin/python benchmarks/key_temperature.py --split dev --count 60 --methods "nb1 reuse,nb1 reuse t0.9"
    .venv/bin/python benchmarks/key_temperature.py --quick     # 1 dev fact question, nb1 reuse at T 1 and 0.9

APE (Yang et al., ICLR 2025, arXiv 2502.05431) makes contexts encoded apart behave more like one
sequence without training: a shared prefix (ours: the chunk context), a lower attention
temperature on the contexts' keys and a scaling factor. This script tries the temperature on the
blend: after a layer's cached keys are realigned, the reused (stale) rows' keys are divided by T,
the recomputed rows keep their fresh keys, so every later query (recomputed rows, the question,
every decoded token) reads logits q.k / T on the stale keys. T < 1 sharpens the attention paid to
them, T > 1 flattens it.

It is an experiment, not a product option: it patches the blend's ``realign`` for the methods named
``"<select_eval method> t<T>"`` (T in TEMPERATURES) and runs ``select_eval.py`` with every other
argument unchanged, so the tables, run files and the full-prefill reference are select_eval's.
Results and the decision: docs/TUNING.md (decision log: "No attention temperature on the reused keys").
"""

from __future__ import annotations

import sys
from dataclasses import replace

import cacheblend.blending.blend as blend_mod
import cacheblend.prefilling as prefilling
import select_eval
from cacheblend.blending.rope import realign

TEMPERATURES = (0.7, 0.8, 0.9, 1.05, 1.1)
BASES = ("nb1 reuse", "nb1 deviation", "nb1 lexical named")
_active = {"t": 1.0}  # the temperature of the prefill under way (1.0 outside the patched methods)
_by_config: dict[int, float] = {}  # id(BlendConfig) of a patched method -> T


def _realign_tempered(cached, cos, sin, dtype, room=0):
    out = realign(cached, cos, sin, dtype, room)  # [2, Hkv, N + room, d]; the blend writes its fresh rows over it
    if _active["t"] != 1.0:
        out[0, :, : cached.shape[2]].mul_(1.0 / _active["t"])
    return out


def _tempered_run(run):
    def wrapped(self, request, ratio=None, config=None, started=None):
        _active["t"] = _by_config.get(id(self.config), 1.0)
        try:
            return run(self, request, ratio, config, started)
        finally:
            _active["t"] = 1.0
    return wrapped


def register() -> None:
    """Adds ``"<base> t<T>"`` to select_eval's methods and patches the blend for them."""
    blend_mod.realign = _realign_tempered
    prefilling.Prefiller.run = _tempered_run(prefilling.Prefiller.run)
    for base in BASES:
        for t in TEMPERATURES:
            config, selector = select_eval.METHODS[base]
            config = replace(config)  # its own object: the temperature is looked up by identity
            _by_config[id(config)] = t
            select_eval.METHODS[f"{base} t{t}"] = (config, selector)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    register()
    select_eval.main_with(__doc__, "nb1 reuse,nb1 reuse t0.9", argv)


if __name__ == "__main__":
    main()
