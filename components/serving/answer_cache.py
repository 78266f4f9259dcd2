"""An LRU cache of model answers for the serving deployments, keyed by model version and query.

Agents repeat themselves: the same query (a retried turn, a popular task, a health probe) reaches the
Detector and the Retriever again and again, and every repeat costs a full encoder pass. A replica
therefore keeps its recent answers, keyed by ``(model version, normalised query, ...)``.

Exactness: a cached answer must be the answer the model would give now. Two rules make it so.

* The query is normalised (:func:`normalise_query`) *before* the model sees it, cached or not, so
  two texts that share a key are the same model input; the cache never merges inputs the model
  would tell apart.
* The deployment empties the cache when a new model (or catalog) loads, and an answer whose
  request began before that clear is not stored after it (:attr:`AnswerCache.generation`): a batch
  that started on the old model could otherwise store its answer under the new one, since two loads
  can share a version string (the same directory recalibrated, another encoder runtime). The
  version stays in the key, so an entry also says what answered it.
"""

from __future__ import annotations

import re
import unicodedata
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")

_SPACE_RUN = re.compile(r"\s+")


def normalise_query(text: str) -> str:
    """``text`` in Unicode NFC with its whitespace runs collapsed to one space and its ends trimmed.

    Case is kept: a cased model (an LM tokenizer) can answer ``Paris`` and ``paris`` differently,
    and a cache must not decide that for it.
    """
    return _SPACE_RUN.sub(" ", unicodedata.normalize("NFC", text)).strip()


class AnswerCache(Generic[Value]):
    """A bounded least-recently-used map with hit and miss counts; ``size`` 0 turns it off.

    Not thread-safe: a Serve replica's deployment methods run on its one event loop, and that is
    the only place this is read or written.

    ``generation`` counts the clears. A request reads it before it awaits its answer and passes it
    to :meth:`put`: an answer computed by the model (or catalog) that a clear replaced meanwhile is
    then dropped, not stored under the new one, whatever the two call their versions.
    """

    def __init__(self, size: int) -> None:
        self.hits = 0
        self.misses = 0
        self.generation = 0
        self._items: OrderedDict[Hashable, Value] = OrderedDict()
        self.resize(size)

    def get(self, key: Hashable) -> Value | None:
        """The value stored under ``key`` (now the most recently used), or None."""
        if key in self._items:
            self._items.move_to_end(key)
            self.hits += 1
            return self._items[key]
        self.misses += 1
        return None

    def put(self, key: Hashable, value: Value, generation: int | None = None) -> None:
        """Store ``value``, dropping the least recently used entry past ``size``; an answer begun
        before the last :meth:`clear` (``generation`` older than the cache's) is not stored."""
        if self.size == 0 or (generation is not None and generation != self.generation):
            return
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def resize(self, size: int) -> None:
        """A new bound; entries past it go, least recently used first."""
        if size < 0:
            raise ValueError(f"cache size must be >= 0, got {size}")
        self.size = size
        while len(self._items) > size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget every answer (a new model version loaded); the counts stay."""
        self._items.clear()
        self.generation += 1

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, int]:
        """``{"size", "entries", "hits", "misses"}``."""
        return {"size": self.size, "entries": len(self._items), "hits": self.hits, "misses": self.misses}
