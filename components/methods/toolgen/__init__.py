"""The toolgen method package (see method.py)."""
