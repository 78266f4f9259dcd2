"""Weak argument labels for selector training: which words of a query fill a tool's parameters.

ToolLens and the quickstart data judge which tools a query needs but carry no argument values, so
the selector's training targets label them heuristically (weak supervision): numbers fill numeric
parameters in order, as the query writes them ("250" stays an integer, "-2.5" a fraction, which an
``integer`` parameter skips), so every label is one the selector's number grammar can spell.
String parameters take the query's content spans that the tool's own text does not explain (the
entity the request is about: "Paris", "salmon"), preferring capitalised spans and spans after a
preposition, then assigned in the order the query states them. A parameter with no span left is
not labelled. The labels are noisy by construction; the selector
learns to copy spans, and its output is checked against the schema, not against these labels.
"""

from __future__ import annotations

import re
from typing import Any

from components.serving.catalog import Tool

_WORD = re.compile(r"[A-Za-z0-9][\w.\-/:@'&]*")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
# A number in running text, sign included ("-5", "2.5", "250." at a sentence end), but not one
# inside a word, a version or a date ("v2", "1.2.3", "2024-01-02").
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.\-])-?\d+(?:\.\d+)?(?![\w\-]|\.\d)")
_TOOL_WORD = re.compile(r"[a-z0-9]+")
_PREPOSITIONS = "in for of with from to about on at near into by using ingredient called named"
# Function words and the generic request vocabulary ("find", "looking") that never is an argument.
_STOPWORDS = """a an the and or but if then so is are was were be been am do does did have has had i i'm im me
my we our you your it its this that these those there here what which who whom whose when where why how
can could would should will shall may might must please thanks thank hey hi hello ok okay also just need
needs want wants like looking look find search get give show tell let know help some any all more most
many much few new best good great quick question asap today now up out over under in for of with from to
about on at near into by as than planning plan trying try using use ideas idea information info details
list check see make making going go today tomorrow tonight yesterday next last this week weekend month
year morning evening night monday tuesday wednesday thursday friday saturday sunday"""
PREPOSITIONS = frozenset(_PREPOSITIONS.split())
STOPWORDS = frozenset(_STOPWORDS.split())


def _spans(query: str, tool_words: set[str]) -> list[tuple[float, int, str]]:
    """Candidate argument spans with a preference score (higher first) and their position."""
    words = [m.group(0).rstrip(".,!?':;") for m in _WORD.finditer(query)]
    spans: list[tuple[float, int, str]] = []
    run: list[int] = []
    for i, word in enumerate([*words, ""]):
        low = word.lower()
        if word and low not in STOPWORDS and low not in tool_words and not _NUMBER.match(word):
            run.append(i)
            continue
        if run:
            # A capital counts only inside the sentence: the first word is capitalised anyway.
            capital = any(words[j][0].isupper() for j in run if j > 0)
            after_preposition = run[0] > 0 and words[run[0] - 1].lower() in PREPOSITIONS
            score = 2.0 * capital + after_preposition + run[0] * 1e-3
            spans.append((score, run[0], " ".join(words[j] for j in run)))
            run = []
    return spans


def number_label(raw: str, kind: str) -> int | float | None:
    """``raw`` as a label for an ``integer`` / ``number`` parameter; None if it cannot be one."""
    if "." not in raw:
        return int(raw)
    return float(raw) if kind == "number" else None


def weak_arguments(query: str, tool: Tool) -> dict[str, Any]:
    """Heuristic values for ``tool``'s required parameters taken from ``query`` (see module doc)."""
    text = " ".join([tool.name, tool.description, *(f"{p.name} {p.description}" for p in tool.call_params())])
    tool_words = set(_TOOL_WORD.findall(text.lower()))
    numbers = _NUMBER_IN_TEXT.findall(query)
    strings = sum(p.type not in ("integer", "number", "boolean") for p in tool.call_params())
    # The most argument-like spans, then in the order the request states them ("250 JPY to CHF").
    best = sorted(_spans(query, tool_words), key=lambda s: (-s[0], s[1]))[:strings]
    spans = [s for _, _, s in sorted(best, key=lambda s: s[1])]
    args: dict[str, Any] = {}
    for param in tool.call_params():
        if param.type in ("integer", "number"):
            # The first number left that fits the type, in the order the query states them.
            for i, raw in enumerate(numbers):
                value = number_label(raw, param.type)
                if value is not None:
                    args[param.name] = value
                    del numbers[i]
                    break
        elif param.type == "boolean":
            continue  # nothing in a request reliably says true or false
        elif spans:
            args[param.name] = spans.pop(0)
    return args
