"""Decoding from a prefilled cache: sampling, stop strings, streaming text (``decode.py``)."""
