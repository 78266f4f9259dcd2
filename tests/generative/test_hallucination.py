"""Parsing generated outputs into real tools or hallucinations, and free vs constrained decoding."""

from __future__ import annotations

from tiny_lm import NAMES, tiny_lm

from components.generative.constrained import constrained_top_k
from components.generative.hallucination import (
    Output,
    OutputParser,
    empty_rate,
    generate_outputs,
    hallucination_rate,
    hits_to_outputs,
    outputs_to_results,
)
from components.generative.targeted import TargetedLM
from components.generative.tool_tokens import add_tool_tokens


def test_outputs_are_parsed_by_code_token_string_or_name():
    _, tokenizer, codebook = tiny_lm()
    parser = OutputParser(codebook, tokenizer, NAMES)
    eos = tokenizer.eos_token_id
    assert parser.tool([*codebook.codes["2"], eos, 7, 7]) == "2"  # tokens after the end are ignored
    assert parser.tool(tokenizer("Fly / search flights", add_special_tokens=False)["input_ids"]) == "1"
    assert parser.tool(tokenizer(" <<Chef&&recipes>>", add_special_tokens=False)["input_ids"]) == "3"
    assert parser.tool(tokenizer("paris rome", add_special_tokens=False)["input_ids"]) is None
    # A beam that names a tool and goes on (the agent stage's "\nAction Input: ...") names that
    # tool; before, only a whole output was credited and this one counted as a hallucination.
    going_on = [*codebook.codes["2"], *tokenizer("\nAction Input", add_special_tokens=False)["input_ids"]]
    assert parser.tool(going_on) == "2"
    assert parser.tool([*codebook.codes["0"], *codebook.codes["1"]]) is None  # two tools is not one
    assert parser.tool([7, *codebook.codes["1"]]) is None  # a code later on is not what it named
    assert parser.tool([eos]) is None


def test_a_beam_of_whitespace_is_empty_not_a_hallucination():
    # A beam that writes a newline (or spaces) and stops tried no name: before, only a beam with no
    # tokens at all was empty, and this one counted as an invented tool.
    _, tokenizer, codebook = tiny_lm()
    parser = OutputParser(codebook, tokenizer, NAMES)
    eos = tokenizer.eos_token_id
    blank = [*tokenizer("\n  ", add_special_tokens=False)["input_ids"], eos]
    assert tokenizer.decode(parser.strip(blank)).strip() == "" and parser.strip(blank)
    words = [*tokenizer("paris", add_special_tokens=False)["input_ids"], eos]
    named = [*codebook.codes["1"], eos]
    beams = [[parser.output(blank, -0.1), parser.output(words, -0.2), parser.output(named, -0.3)]]
    assert [o.empty for o in beams[0]] == [True, False, False]
    assert [o.tool for o in beams[0]] == [None, None, "1"]
    assert empty_rate(beams) == 1 / 3 and hallucination_rate(beams) == 1 / 3
    # The generated path builds its outputs the same way.
    assert parser.output([eos], 0.0).empty and not parser.output(named, 0.0).empty


def test_a_coded_tool_outside_the_catalog_is_no_tool():
    # A method indexed on a narrower catalog keeps every trained code: naming a tool left out of the
    # catalog is a hallucination there, not a hit.
    _, tokenizer, codebook = tiny_lm()
    catalog = {t: n for t, n in NAMES.items() if t != "2"}
    parser = OutputParser(codebook, tokenizer, catalog)
    assert parser.tool(list(codebook.codes["2"])) is None
    assert parser.tool(list(codebook.codes["1"])) == "1"


def test_a_name_two_tools_share_names_neither(caplog):
    # Tools "2" and "4" share one name: a text spelling it identifies neither (before, the last one
    # listed took it), while each tool's own token string still names that tool.
    lm, tokenizer, codebook = tiny_lm()
    names = {**NAMES, "4": NAMES["2"]}
    add_tool_tokens(lm, tokenizer, names, codebook)
    parser = OutputParser(codebook, tokenizer, names)
    assert "shared by several tools" in caplog.text
    assert parser.tool(tokenizer("Stay / hotel search", add_special_tokens=False)["input_ids"]) is None
    assert parser.tool(tokenizer("Fly / search flights", add_special_tokens=False)["input_ids"]) == "1"
    for tool in ("2", "4"):
        spelled = tokenizer.convert_ids_to_tokens(list(codebook.codes[tool]))[0]
        assert parser.tool(tokenizer(f" {spelled}", add_special_tokens=False)["input_ids"]) == tool


def test_rate_and_results_from_beams():
    beams = [
        [Output([1], -0.1, "a"), Output([2], -0.5, None), Output([1], -0.7, "a"), Output([3], -0.9, "b")],
        [Output([2], -0.2, None), Output([2], -0.3, None)],
    ]
    assert hallucination_rate(beams) == 3 / 6
    # An empty beam (end of sequence first) names nothing: not a hallucination, counted apart.
    with_empty = [*beams, [Output([], -0.4, None), Output([4], -0.6, None)]]
    assert hallucination_rate(with_empty) == 4 / 8 and empty_rate(with_empty) == 1 / 8
    assert outputs_to_results(["q1", "q2"], beams, k=3) == {"q1": {"a": -0.1, "b": -0.9}, "q2": {}}
    # Top 1 is one tool, the best beam's, although generation ran more beams than k.
    assert outputs_to_results(["q1", "q2"], beams, k=1) == {"q1": {"a": -0.1}, "q2": {}}


def test_an_untrained_model_hallucinates_unless_constrained():
    model, tokenizer, codebook = tiny_lm(seed=3)
    parser = OutputParser(codebook, tokenizer, NAMES)
    prompts = [tokenizer(t)["input_ids"] for t in ("weather in paris", "flights to rome", "a hotel")]
    free = generate_outputs(model, tokenizer, prompts, parser, 4, 3)
    hits = constrained_top_k(TargetedLM(model), prompts, codebook.trie(), 4, tokenizer.pad_token_id)
    constrained = hits_to_outputs(hits, codebook)
    assert hallucination_rate(free) > 0.5
    assert hallucination_rate(constrained) == 0.0
