"""The local selector LM: trained for real, constrained to the candidates, typed JSON arguments."""

from __future__ import annotations

import json
import os
import random

import pytest
from conftest import LOCAL_MODE
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import SELECTOR_LM, torch_threads

from components.data import open_dataset
from components.generative.lm import train_bpe
from components.methods import load
from components.serving.catalog import load_catalog
from components.serving.selector_lm import LMSelector
from components.serving.selector_train import train_selector_lm
from components.training.spec import RunSpec


@pytest.fixture(scope="module")
def trained(selector_lm, catalog) -> LMSelector:
    return LMSelector(selector_lm[0], catalog)


@pytest.fixture(scope="module")
def untrained(selector_lm, catalog) -> LMSelector:
    """The same LM before training: the initial model train_selector_lm built and saved beside its
    output (``<out>.train/local/selector-init``) and started its Ray Train run from."""
    init = f"{selector_lm[0]}.train/local/selector-init"
    assert os.path.isdir(init), init
    return LMSelector(init, catalog)


def accuracy(selector: LMSelector, dataset, bm25, n: int = 150) -> float:
    queries = dict(list(dataset.split_queries("test").items())[:n])
    ranked = bm25.retrieve(queries, 5)
    hits = 0
    for qid, text in queries.items():
        candidates = sorted(ranked[qid], key=lambda t: -ranked[qid][t])
        call = selector.select(text, [], candidates) if candidates else None
        hits += bool(call) and call["tool"] in dataset.qrels["test"][qid]
    return hits / len(queries)


def test_training_lowers_the_loss(selector_lm):
    _, report = selector_lm
    assert report["last_loss"] < report["first_loss"] * 0.5 and report["examples"] > 100


def test_trained_selector_beats_untrained(trained, untrained, dataset, bm25_versions):
    bm25 = load(bm25_versions["default"])
    with torch_threads(1):
        good, bad = accuracy(trained, dataset, bm25), accuracy(untrained, dataset, bm25)
    print(good, bad)
    assert good > bad + 0.15, (good, bad)


def test_only_candidates_can_be_named_and_arguments_follow_the_schema(trained, catalog, dataset):
    rng = random.Random(0)
    ids = list(catalog.tools)
    queries = list(dataset.split_queries("test").values())[:25]
    for query in queries:
        candidates = rng.sample(ids, 3)  # unrelated candidates: the LM must still pick one of them
        call = trained.select(query, [], candidates)
        assert call is not None and call["tool"] in candidates
        tool = catalog.tools[call["tool"]]
        assert [p.name for p in tool.required] == list(call["arguments"])
        for param in tool.required:
            value = call["arguments"][param.name]
            expected = {"integer": int, "number": (int, float), "boolean": bool, "array": list}.get(
                param.type, str
            )
            assert isinstance(value, expected) and value != ""
        assert json.loads(json.dumps(call["arguments"])) == call["arguments"]


def test_a_call_that_breaks_the_tools_own_schema_is_no_call(trained, catalog, dataset, monkeypatch):
    # The grammar holds required keys and base types; an enum it cannot see is checked afterwards.
    from dataclasses import replace

    query = next(iter(dataset.split_queries("test").values()))
    tool = next(t for t in catalog.tools.values() if t.call_params())
    assert trained.select(query, [], [tool.id]) is not None
    schema = {
        "type": "object",
        "properties": {"unit": {"type": "string", "enum": ["zz-no-word-the-lm-knows"]}},
        "required": ["unit"],
    }
    monkeypatch.setitem(catalog.tools, tool.id, replace(tool, input_schema=schema))
    assert trained.catalog.tools[tool.id].input_schema == schema  # the selector reads this catalog
    assert trained.select(query, [], [tool.id]) is None


def test_no_known_candidate_means_no_call(trained):
    assert trained.select("weather in Paris", [], ["not-a-tool"]) is None
    assert trained.select("weather in Paris", [], []) is None


@pytest.fixture(scope="module")
def number_tokenizer():
    """A real byte-level BPE that has seen signed and fractional numbers (and non-ASCII digits)."""
    texts = ["amount = -2.5", "amount = 250", "count = 3", "price = 12.75", "pay 0.5 or -1 now"] * 20
    return train_bpe([*texts, *["weather in Paris ² ³ ٣"] * 20], vocab_size=300)


def walk(grammar, ids: list[int]) -> int | None:
    """The grammar state after ``ids``, or None once a token is not allowed."""
    from components.serving.selector_lm import START

    state = START
    for token in ids:
        if not bool(grammar.allowed(state)[token]):
            return None
        state = grammar.step(state, token)
    return state


def test_number_grammar_allows_one_point_after_a_digit_for_numbers_only(number_tokenizer):
    from components.serving.selector_lm import ACCEPTING, INT, TypeMasks

    tok = number_tokenizer
    masks = TypeMasks(tok, len(tok))
    number, integer = masks.numbers["number"], masks.numbers["integer"]

    def ids(value: str) -> list[int]:
        return tok(" " + value, add_special_tokens=False)["input_ids"]  # as CallFormat.value writes it

    point = tok.convert_tokens_to_ids(".")
    assert bool(number.allowed(INT)[point]) and not bool(integer.allowed(INT)[point])
    for value in ("-2.5", "12.75", "0.5"):
        assert walk(number, ids(value)) in ACCEPTING, value
        assert walk(integer, ids(value)) is None, value  # never a "." in an integer
    for value in ("250", "-1", "3"):
        assert walk(number, ids(value)) in ACCEPTING and walk(integer, ids(value)) in ACCEPTING, value
    for value in ("2.5.5", "--2", "2-5", ".5", "²", "٣", "Paris"):
        assert walk(number, ids(value)) is None, value
    for value in ("-", "2."):  # not a number yet: </s> may not end it here
        assert walk(number, ids(value)) not in ACCEPTING, value
    assert bool(masks.string[ids("Paris")[0]]) and not bool(masks.string[tok.eos_token_id])


@pytest.fixture(scope="module")
def decimal_selector(ray_session, tmp_path_factory) -> tuple[LMSelector, dict[str, str]]:
    """A selector LM trained here on a catalog whose ``number`` arguments are all fractions."""
    root = tmp_path_factory.mktemp("decimal")
    text = (
        "category_name:Finance, tool_name:FX, api_name:convert, api_description:Convert money, "
        'required_params: [{"name": "amount", "type": "NUMBER", "description": "how much"}, '
        '{"name": "times", "type": "INTEGER", "description": "repeat"}], optional_params: [], '
        "return_schema: {}"
    )
    rng = random.Random(0)
    queries = {
        f"q{i}": f"convert {rng.choice(['-', ''])}{rng.randint(1, 99)}.{rng.randint(1, 99)} dollars "
        f"{rng.randint(2, 9)} times"
        for i in range(120)
    }
    (root / "qrels").mkdir()
    (root / "corpus.jsonl").write_text(
        json.dumps({"_id": "0", "title": "", "text": text, "metadata": {}}) + "\n"
    )
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items())
    )
    header = "query-id\tcorpus-id\tscore\n"
    for split, ids in (("train", list(queries)[:100]), ("test", list(queries)[100:])):
        (root / "qrels" / f"{split}.tsv").write_text(header + "".join(f"{q}\t0\t1\n" for q in ids))
    catalog = load_catalog(str(root))
    tiny = {**SELECTOR_LM, "vocab_size": 300, "hidden_size": 32, "num_layers": 1, "max_length": 48}
    with torch_threads(1):
        run = RunSpec(
            name="selector", storage_path=str(root / "train"), local_dir=str(root / "local"), **LOCAL_MODE
        )
        train_selector_lm(
            open_dataset(str(root)), catalog, str(root / "lm"), lm=tiny, steps=150, lr=3e-3, run=run
        )
    return LMSelector(str(root / "lm"), catalog), {q: queries[q] for q in list(queries)[100:]}


def test_a_number_parameter_can_get_a_fraction(decimal_selector):
    # Every training label of `amount` has a "." (and some a "-"): the old digits-only mask could
    # never spell one, whatever the LM had learned.
    selector, queries = decimal_selector
    calls = [selector.select(q, [], ["0"]) for q in queries.values()]
    amounts = [c["arguments"]["amount"] for c in calls]
    assert sum(isinstance(a, float) for a in amounts) >= len(amounts) // 2, amounts
    assert all(isinstance(c["arguments"]["times"], int) for c in calls)


def test_each_epoch_trains_on_the_next_rows_not_the_same_first_ones():
    # train_data was the first rows_per_epoch rows, the same every epoch: 960 of 20,000 examples.
    from types import SimpleNamespace

    from components.serving.selector_task import SelectorTask

    task = SelectorTask.__new__(SelectorTask)  # the data path only: no LM, no Ray
    task.rows, task.params = [([i], [i]) for i in range(20_000)], SimpleNamespace(rows_per_epoch=960)
    data = task.train_data()
    seen = []
    for epoch in range(5):
        task.start_epoch(None, epoch)
        seen += [data[i][0][0] for i in range(len(data))]
    assert len(data) == 960 and len(set(seen)) == 5 * 960
    # A split smaller than an epoch cycles through every row each epoch, as before.
    task.rows = [([i], [i]) for i in range(100)]
    task.start_epoch(None, 3)
    assert sorted({data[i][0][0] for i in range(len(data))}) == list(range(100))
