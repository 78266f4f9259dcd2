"""A prefix trie over token-id sequences, for constrained decoding.

Generative tool retrieval (ToolGen, arXiv 2410.03439; ToolWeaver, arXiv 2601.21947) and the Serve
selector only let the LM emit sequences that name a real tool: at each step the allowed next tokens
are the children of the trie node the generated prefix reaches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class TokenTrie:
    """Token-id sequences with a value at each complete sequence (e.g. the tool id it spells)."""

    def __init__(self, sequences: Iterable[tuple[Sequence[int], str]] = ()) -> None:
        self._root: dict = {}
        self._values: dict[tuple[int, ...], str] = {}
        for seq, value in sequences:
            self.insert(seq, value)

    def insert(self, sequence: Sequence[int], value: str) -> None:
        """Add ``sequence``; :meth:`value` of the full sequence returns ``value``."""
        if not sequence:
            raise ValueError("cannot insert an empty token sequence")
        key = tuple(int(t) for t in sequence)
        if key in self._values and self._values[key] != value:
            raise ValueError(f"token sequence {key} already spells {self._values[key]!r}, not {value!r}")
        node = self._root
        for t in key:
            node = node.setdefault(t, {})
        self._values[key] = value

    def __len__(self) -> int:
        return len(self._values)

    def _node(self, prefix: Sequence[int]) -> dict | None:
        node = self._root
        for t in prefix:
            node = node.get(int(t))
            if node is None:
                return None
        return node

    def allowed(self, prefix: Sequence[int]) -> list[int]:
        """Tokens that extend ``prefix`` towards some sequence; empty if none (or off the trie)."""
        node = self._node(prefix)
        return sorted(node) if node else []

    def value(self, sequence: Sequence[int]) -> str | None:
        """The value stored at exactly ``sequence``, else ``None``."""
        return self._values.get(tuple(int(t) for t in sequence))

    def values(self) -> list[str]:
        return list(self._values.values())

    def items(self) -> list[tuple[tuple[int, ...], str]]:
        """Every (token sequence, value) pair, in insertion order."""
        return list(self._values.items())

    @property
    def depth(self) -> int:
        """Length of the longest sequence (1 when every code is a single token, as in ToolGen)."""
        return max((len(k) for k in self._values), default=0)

    def has_children(self, prefix: Sequence[int]) -> bool:
        """Whether some longer sequence continues ``prefix``."""
        return bool(self._node(prefix))
