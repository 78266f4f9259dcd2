"""The bm25 method package (see method.py)."""
