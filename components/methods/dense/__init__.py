"""The dense method package (see method.py)."""
