"""Tool virtualization: one token per tool, initialised from the tool's name; saving and reloading."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import NAMES, tiny_lm

from components.generative.bundle import load_bundle, save_bundle
from components.generative.tool_tokens import (
    ToolCodebook,
    add_code_tokens,
    add_tool_tokens,
    init_code_rows,
    tool_token,
)


def test_tool_token_string_follows_toolgen():
    assert tool_token("Worldwide Recipes / Suggestions") == "<<Worldwide_Recipes&&Suggestions>>"
    assert tool_token("solo") == "<<solo>>"


@pytest.mark.parametrize("tied", [True, False])
def test_one_token_per_tool_initialised_as_mean_of_name_tokens(tied):
    lm, tokenizer, _ = tiny_lm(tools=False, tied=tied)
    before = len(tokenizer)
    inputs = lm.get_input_embeddings().weight.detach().clone()
    outputs = lm.get_output_embeddings().weight.detach().clone()
    codebook = add_tool_tokens(lm, tokenizer, NAMES)
    assert len(tokenizer) == before + len(NAMES)
    assert lm.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert lm.get_output_embeddings().weight.shape[0] == len(tokenizer)
    assert (lm.get_output_embeddings().weight is lm.get_input_embeddings().weight) == tied
    for tool, name in NAMES.items():
        (token,) = codebook.codes[tool]
        assert token >= before
        spoken = tokenizer(" ".join(name.split(" / ")), add_special_tokens=False)["input_ids"]
        assert max(spoken) < before
        torch.testing.assert_close(lm.get_input_embeddings().weight[token], inputs[spoken].mean(0))
        torch.testing.assert_close(lm.get_output_embeddings().weight[token], outputs[spoken].mean(0))
        # The token string is one token for the tokenizer, inside running text too.
        ids = tokenizer(f"call {tokenizer.convert_ids_to_tokens(token)} now", add_special_tokens=False)[
            "input_ids"
        ]
        assert token in ids
    # Old rows are untouched.
    torch.testing.assert_close(lm.get_input_embeddings().weight[:before], inputs)


@pytest.mark.parametrize("tied", [True, False])
def test_code_rows_start_at_the_mean_name_row_of_the_tools_they_spell(tied):
    lm, tokenizer, _ = tiny_lm(tools=False, tied=tied)
    torch.manual_seed(0)
    ids = add_code_tokens(lm, tokenizer, levels=2, size=3)
    tables = [lm.get_input_embeddings().weight, lm.get_output_embeddings().weight]
    sampled = [t.detach().clone() for t in tables]
    # Tools 0 and 1 share first-level code 0; tool 2 has code 1; first-level code 2 spells nothing.
    codes = {"0": (0, 0), "1": (0, 1), "2": (1, 2)}
    assert init_code_rows(lm, tokenizer, ids, codes, NAMES) == 5

    def name_row(table, tool):
        spoken = tokenizer(" ".join(NAMES[tool].split(" / ")), add_special_tokens=False)["input_ids"]
        return table[spoken].mean(0)

    for table, before in zip(tables, sampled, strict=True):
        first = (name_row(before, "0") + name_row(before, "1")) / 2
        torch.testing.assert_close(table[ids[0][0]], first)
        torch.testing.assert_close(table[ids[0][1]], name_row(before, "2"))
        torch.testing.assert_close(table[ids[1][1]], name_row(before, "1"))
        torch.testing.assert_close(table[ids[1][2]], name_row(before, "2"))
        torch.testing.assert_close(table[ids[0][2]], before[ids[0][2]])  # unused: still sampled
        assert not torch.equal(table[ids[0][0]], before[ids[0][0]])


def test_adding_is_idempotent_and_extends_an_existing_codebook():
    lm, tokenizer, codebook = tiny_lm()
    size = len(tokenizer)
    assert add_tool_tokens(lm, tokenizer, NAMES, codebook) is codebook
    assert len(tokenizer) == size
    add_tool_tokens(lm, tokenizer, {"new": "Sky / forecast"}, codebook)  # a second tool with the same name
    assert len(tokenizer) == size + 1 and len(codebook) == len(NAMES) + 1
    assert codebook.codes["new"] != codebook.codes["0"]
    assert tokenizer.convert_ids_to_tokens(codebook.codes["new"][0]) == "<<Sky&&forecast#new>>"


def test_codebook_lookup_and_narrowed_trie():
    codebook = ToolCodebook({"a": [5], "b": [6, 7], "c": [6, 8]})
    assert codebook.tool_of([6, 7]) == "b" and codebook.tool_of([6]) is None and codebook.max_length == 2
    assert sorted(codebook.trie().values()) == ["a", "b", "c"]
    narrowed = codebook.trie(["c", "unknown"])
    assert narrowed.values() == ["c"] and narrowed.allowed(()) == [6] and narrowed.allowed([6]) == [8]
    with pytest.raises(ValueError, match="already names"):
        codebook.add("d", [5])


def test_a_recoded_tool_frees_its_old_code():
    # A loaded codebook given a new quantizer's codes: "x" moves from (1, 5) to (3, 7), and (1, 5)
    # is free for "y". The old entry stayed: (1, 5) still decoded to "x" and "y" was refused it.
    codebook = ToolCodebook({"x": [1, 5]})
    codebook.add("x", [3, 7])
    assert codebook.tool_of([1, 5]) is None and codebook.tool_of([3, 7]) == "x"
    codebook.add("y", [1, 5])
    assert codebook.codes == {"x": (3, 7), "y": (1, 5)} and sorted(codebook.trie().values()) == ["x", "y"]


def test_a_whole_new_assignment_is_taken_at_once_and_a_shared_code_is_refused():
    # Tool by tool, "a" taking (11, 21) while "b" still held it was refused: a warm-started
    # ToolWeaver whose new quantizer swapped two tools' codes failed at memorization.
    codebook = ToolCodebook({"a": [10, 20], "b": [11, 21], "gone": [12, 22]})
    codebook.recode({"a": [11, 21], "b": [10, 20], "new": [12, 22]})
    assert codebook.codes == {"a": (11, 21), "b": (10, 20), "new": (12, 22)}
    assert codebook.tool_of([12, 22]) == "new" and sorted(codebook.trie().values()) == ["a", "b", "new"]
    # Two tools with one code: decoding would name only the last; refused when built.
    with pytest.raises(ValueError, match=r"code \(1,\) already names tool 'A', not 'B'"):
        ToolCodebook({"A": [1], "B": [1]})
    with pytest.raises(ValueError, match="already names"):
        codebook.recode({"a": [1, 2], "b": [1, 2]})
    assert codebook.codes["a"] == (11, 21)  # a refused assignment changes nothing


def test_bundle_round_trip(tmp_path):
    lm, tokenizer, codebook = tiny_lm()
    save_bundle(lm, tokenizer, codebook, str(tmp_path / "b"))
    lm2, tokenizer2, codebook2 = load_bundle(str(tmp_path / "b"))
    assert codebook2.codes == codebook.codes and len(tokenizer2) == len(tokenizer)
    text = f"weather {tokenizer.convert_ids_to_tokens(codebook.codes['0'][0])}"
    assert tokenizer2(text)["input_ids"] == tokenizer(text)["input_ids"]
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    torch.testing.assert_close(lm2(input_ids=ids).logits, lm(input_ids=ids).logits)


@pytest.mark.parametrize("tied", [True, False])
def test_a_table_padded_past_the_tokenizer_keeps_its_rows_and_new_tokens_get_theirs(tied):
    # Qwen2.5's tables have 271 rows more than its tokenizer has tokens. Adding fewer tokens than
    # that used to shrink the table (and, for codes, fail on a negative row count); the new code
    # rows were written from the old table end instead of at the new tokens' ids.
    lm, tokenizer, _ = tiny_lm(tools=False, tied=tied)
    real = len(tokenizer)
    lm.resize_token_embeddings(real + 20, mean_resizing=False)
    tables = lambda: [lm.get_input_embeddings().weight, lm.get_output_embeddings().weight]  # noqa: E731
    padded = [t.detach().clone() for t in tables()]
    torch.manual_seed(0)
    ids = add_code_tokens(lm, tokenizer, levels=2, size=4)  # 8 new tokens, into the padding
    flat = [i for level in ids for i in level]
    assert flat == list(range(real, real + 8))
    for table, before in zip(tables(), padded, strict=True):
        assert table.shape[0] == real + 20  # not shrunk to len(tokenizer)
        # Each new row was sampled (not left as it was padded); every other row is as it was.
        assert all(not torch.equal(table[i], before[i]) for i in flat)
        torch.testing.assert_close(table[real + 8 :], before[real + 8 :])
        torch.testing.assert_close(table[:real], before[:real])
    # Tool tokens after them land past the codes, in the padding too, and the table still holds.
    codebook = add_tool_tokens(lm, tokenizer, NAMES)
    assert lm.get_input_embeddings().weight.shape[0] == max(real + 20, len(tokenizer))
    assert all(codebook.codes[t][0] >= real + 8 for t in NAMES)
    logits = lm(torch.tensor([[1, *flat]])).logits
    assert logits.shape[-1] == lm.get_input_embeddings().weight.shape[0] and torch.isfinite(logits).all()
