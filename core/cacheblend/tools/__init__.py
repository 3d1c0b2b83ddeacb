"""Tooling on top of the engine: the benchmark, its corpora and quality measures, the demo index.

Used by the ``cacheblend`` command (``cli.py``) and ``benchmarks/``; nothing in the engine
imports these.
"""
