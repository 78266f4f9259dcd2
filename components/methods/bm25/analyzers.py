"""Text analyzers for lexical retrieval.

``default``: word tokens of 2+ characters, English stopwords removed, Snowball English stemming,
the bm25s defaults.

``colt``: the set-up that reproduces the BM25 row published for ToolLens (COLT, CIKM 2024;
repeated in MassTool, arXiv 2507.00487) within 0.005 on R@3, R@5, N@3 and N@5: lower-cased text
split on whitespace (punctuation stays attached), the 33-word English stop list, no stemming,
Lucene scoring with its default k1=1.2, b=0.75, over the tool's documentation without its return
schema (:data:`DOC_FIELDS`). Neither paper's repository ships its BM25 code; this set-up was found
by ``benchmarks/bm25_reproduction.py``, which scores 1,800 settings against the published figures
(``benchmarks/results/bm25_reproduction.md``). Every one of the settings within 0.005 on all four
splits on whitespace and leaves the schema out.

``lucene``: a Lucene-style StandardTokenizer (Unicode word boundaries as in UAX #29: letters,
digits and underscores form one token; ``.``/``'`` join letters or digits, ``:`` joins letters,
``,`` joins digits), lower-casing, no stopwords, Porter stemming, BM25 k1=1.2, b=0.75. It aims at
the BM25 row published for ToolLens (COLT, CIKM 2024; MassTool, arXiv 2507.00487): on the test
split it lands within 0.005 on R@3, N@3 and N@5 but 0.011 under on R@5
(``benchmarks/results/toollens_bm25.md``). Lucene's one-byte document-length norms, dropping
repeated query terms, stopword lists, other fields and bm25s's other scoring variants (Robertson,
ATIRE, BM25L, BM25+) were each tried and none matched all four: their R@5/R@3 ratios are
1.20-1.22 at k1 1.2, b 0.75, the published row's 1.25. ``benchmarks/bm25_reproduction.py`` sweeps
every tokenizer, stop list, stemmer, field choice, scoring variant and (k1, b) below against the
published row (``benchmarks/results/bm25_reproduction.md``).

Analyzer parts beyond the two profiles, so that other published BM25 set-ups can be rebuilt:
tokenizers ``whitespace`` (lower-cased text split on whitespace, the ``rank_bm25`` habit) and
``word`` (every run of word characters); stop lists ``english`` (the 33 words of Lucene's and
Elasticsearch's English set), ``nltk`` (NLTK's 179) or ``none``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import bm25s.stopwords
import Stemmer

_LETTER = r"[^\W\d_]"
_LUCENE_TOKEN = re.compile(
    r"\w+(?:(?:[.'’]|(?<=" + _LETTER + r")[:·](?=" + _LETTER + r")|(?<=\d)[,;](?=\d))\w+)*"
)
_DEFAULT_TOKEN = re.compile(r"(?u)\b\w\w+\b")
_WORD_TOKEN = re.compile(r"\w+")
_WHITESPACE_TOKEN = re.compile(r"\S+")
TOKENIZERS = {
    "default": _DEFAULT_TOKEN,
    "lucene": _LUCENE_TOKEN,
    "word": _WORD_TOKEN,
    "whitespace": _WHITESPACE_TOKEN,
}
# "english" is bm25s's list: the 33 words of Lucene's EnglishAnalyzer and Elasticsearch's
# ``_english_``; "nltk" is bm25s's longer list, NLTK's 179 English stopwords.
STOPWORDS = {
    "english": frozenset(bm25s.stopwords.STOPWORDS_EN),
    "nltk": frozenset(bm25s.stopwords.STOPWORDS_EN_PLUS),
    "none": frozenset(),
}
MAX_TOKEN_CHARS = 255  # Lucene's StandardTokenizer default


@dataclass(frozen=True)
class Analyzer:
    """A tokenizer + stopword + stemmer pipeline, described by plain fields so it saves as JSON."""

    tokenizer: str = "default"  # a key of TOKENIZERS
    stopwords: str = "english"  # a key of STOPWORDS
    stemmer: str = "english"  # a PyStemmer algorithm ("english", "porter") or "none"

    def __post_init__(self) -> None:
        for part, value, known in (
            ("tokenizer", self.tokenizer, TOKENIZERS),
            ("stopwords", self.stopwords, STOPWORDS),
        ):
            if value not in known:
                raise ValueError(f"unknown analyzer {part} {value!r}; choose one of {sorted(known)}")
        if self.stemmer != "none" and self.stemmer not in Stemmer.algorithms():
            raise ValueError(f"unknown stemmer {self.stemmer!r}; use 'none' or one of {Stemmer.algorithms()}")

    def tokens(self, text: str) -> list[str]:
        """Analyzed tokens of one text."""
        stop = STOPWORDS[self.stopwords]
        words = [w for w in TOKENIZERS[self.tokenizer].findall(text.lower()) if len(w) <= MAX_TOKEN_CHARS]
        words = [w for w in words if w not in stop]
        return stemmer(self.stemmer).stemWords(words) if self.stemmer != "none" else words

    def __call__(self, texts: list[str]) -> list[list[str]]:
        return [self.tokens(t) for t in texts]


_STEMMERS = threading.local()


def stemmer(algorithm: str) -> Stemmer.Stemmer:
    """This thread's PyStemmer for ``algorithm``. Not held by the analyzer: a ``Stemmer`` cannot be
    pickled (a BM25 method that had analyzed text could not go to a Ray worker, nor could a fresh
    one, the profiles' analyzers being shared), and one instance must not be called from two
    threads at once (PyStemmer's own rule; serving answers from several)."""
    found = getattr(_STEMMERS, "by_algorithm", None)
    if found is None:
        found = _STEMMERS.by_algorithm = {}
    if algorithm not in found:
        found[algorithm] = Stemmer.Stemmer(algorithm)
    return found[algorithm]


# A tool's documentation without its return schema (the JSON keys of the response).
DOC_FIELDS = ("category", "tool", "api", "description", "required_params", "optional_params")

# Each profile fixes the analyzer and the indexed text ("raw": the whole tool document), and
# presets k1 and b.
PROFILES: dict[str, dict] = {
    "default": {"analyzer": Analyzer("default", "english", "english"), "k1": 1.5, "b": 0.75, "fields": "raw"},
    "lucene": {"analyzer": Analyzer("lucene", "none", "porter"), "k1": 1.2, "b": 0.75, "fields": "raw"},
    "colt": {
        "analyzer": Analyzer("whitespace", "english", "none"),
        "k1": 1.2,
        "b": 0.75,
        "fields": DOC_FIELDS,
    },
}
