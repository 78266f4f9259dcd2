"""Bad rows are never dropped silently: each goes to a reject log with file, line and reason."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from components.data import io

MAX_CONTENT_CHARS = 2000


class DatasetError(ValueError):
    """A dataset cannot be used at all (a missing or empty required file, a missing split)."""


class StrictModeError(DatasetError):
    """Raised in strict mode when any row was rejected."""


@dataclass(frozen=True)
class Reject:
    """One rejected row: where it was and why. ``content`` keeps the raw row so nothing is lost."""

    file: str
    line: int
    reason: str
    content: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


def clipped(content: str) -> str:
    """``content`` cut to ``MAX_CONTENT_CHARS``, saying how much was cut (never silently)."""
    if len(content) <= MAX_CONTENT_CHARS:
        return content
    return content[:MAX_CONTENT_CHARS] + f"...[{len(content) - MAX_CONTENT_CHARS} more chars]"


@dataclass
class RejectLog:
    """Collects rejects from every file of a load."""

    rejects: list[Reject] = field(default_factory=list)
    # Lossless clean-ups worth reporting (e.g. identical duplicate qrels rows merged), by kind.
    notes: Counter = field(default_factory=Counter)

    def add(self, file: str, line: int, reason: str, content: str = "") -> None:
        """Record one bad row; content longer than ``MAX_CONTENT_CHARS`` is truncated with a marker."""
        self.rejects.append(Reject(file, line, reason, clipped(content)))

    def note(self, what: str, n: int = 1) -> None:
        """Count a lossless clean-up (reported in manifests, never a failure)."""
        self.notes[what] += n

    def extend(self, rejects: list[Reject]) -> None:
        """Append rejects found elsewhere (for example by Ray Data workers)."""
        self.rejects.extend(rejects)

    def __len__(self) -> int:
        return len(self.rejects)

    def counts(self) -> dict[str, int]:
        """Reject counts by file name."""
        return dict(sorted(Counter(r.file for r in self.rejects).items()))

    def reason_counts(self) -> dict[str, int]:
        """Reject counts by reason: its text before any ``:``, with quoted and parenthesised
        values (ids, pairs) blanked, so that "unknown query-id 'q7' ..." and "... 'q8' ..." count
        as one reason, not one per id."""
        return dict(Counter(reason_kind(r.reason) for r in self.rejects).most_common())

    def sorted(self) -> list[Reject]:
        """Rejects in file, line order (workers report them out of order)."""
        return sorted(self.rejects, key=lambda r: (r.file, r.line, r.reason))

    def write(self, path: str, storage_options: dict | None = None) -> None:
        """Write the log as JSON lines: one ``{file, line, reason, content}`` per reject."""
        lines = [json.dumps(asdict(r), ensure_ascii=False) for r in self.sorted()]
        io.write_bytes(path, ("\n".join(lines) + ("\n" if lines else "")).encode(), storage_options)

    def listing(self, limit: int) -> str:
        """The first ``limit`` rejects as indented ``file:line: reason`` lines, and how many more."""
        shown = "".join(f"\n  {r}" for r in self.sorted()[:limit])
        more = f"\n  ... and {len(self) - limit} more" if len(self) > limit else ""
        return shown + more

    def summary(self, source: str, limit: int = 5) -> str:
        """A warning naming the first ``limit`` rejects of a load from ``source`` with file and line."""
        return f"warning: {len(self)} row(s) rejected while loading {source}:{self.listing(limit)}"

    def check_strict(self, limit: int = 20, written_to: str | None = None) -> None:
        """Raise :class:`StrictModeError` listing the first ``limit`` rejects, if there are any.

        Args:
            written_to: Where the full reject file was written, named in the message.
        """
        if not self.rejects:
            return
        full = f"\n  every reject: {written_to}" if written_to else ""
        raise StrictModeError(f"--strict: {len(self)} row(s) rejected:{self.listing(limit)}{full}")


def reason_kind(reason: str) -> str:
    """``reason`` without the values that differ from row to row (see :meth:`RejectLog.reason_counts`)."""
    blanked = re.sub(r"'[^']*'|\"[^\"]*\"|\([^)]*\)", "…", reason).split(":")[0]
    return re.sub(r"…(\s*…)+", "…", blanked).strip()
