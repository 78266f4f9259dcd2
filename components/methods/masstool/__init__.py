"""The masstool method package (see method.py)."""
