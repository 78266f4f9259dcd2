"""The query-rewriting slot: pass-through, history, and a causal-LM rewriter loaded from a dir."""

from __future__ import annotations

import pytest
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)

from components.serving.rewriter import HistoryRewriter, LMRewriter, PassThrough, build_rewriter


def test_passthrough_and_history():
    assert build_rewriter(None).rewrite("weather?", ["Paris"]) == "weather?"
    assert isinstance(build_rewriter({"backend": "passthrough"}), PassThrough)
    rewriter = build_rewriter({"backend": "history", "turns": 2})
    assert isinstance(rewriter, HistoryRewriter)
    assert (
        rewriter.rewrite("and there?", ["a", "flying to Rome", "tomorrow"])
        == "flying to Rome tomorrow and there?"
    )
    assert HistoryRewriter(0).rewrite("q", ["a"]) == "q"
    with pytest.raises(ValueError, match="unknown rewriter"):
        build_rewriter({"backend": "nope"})


def test_lm_rewriter_generates_from_a_saved_causal_lm(selector_lm):
    rewriter = build_rewriter({"backend": "lm", "model": selector_lm[0], "max_new_tokens": 8})
    assert isinstance(rewriter, LMRewriter)
    text = rewriter.rewrite("weather forecast in Paris", ["I am flying to France"])
    assert isinstance(text, str) and text.strip() and "\n" not in text
