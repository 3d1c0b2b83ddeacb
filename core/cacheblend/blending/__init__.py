"""The algorithm: blended prefill, warm-time encoding, token selection, RoPE math.

``blend.py`` is the one place that knows the algorithm's order; ``warm_forward.py`` computes the chunk
KV it reuses; ``selection.py`` holds the selectors (a new selector is a class there, or in a module of its
own as ``lexical.py``, with ``__call__(Candidates, budget) -> indices``, plus a name in
``BlendConfig`` and ``selectors.make_selector`` if it should be reachable from the config); ``question.py`` computes the score of the two-stage
question selectors (the question's attention in a full-reuse pass, fused over layers and heads);
``rope.py`` is pure math.
"""
