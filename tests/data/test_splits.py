"""Deterministic splits: validation carving, cold start and no-tool query parts."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from components.data.splits import (
    carve_validation,
    cold_start,
    held_out_tools,
    prepare_splits,
    split_items,
    splits_from_config,
    unit_hash,
)
from components.data.types import Dataset, Qrels

TOOLS = [f"t{i}" for i in range(40)]


def random_qrels(n: int, seed: int, prefix: str = "q") -> Qrels:
    rng = random.Random(seed)
    return {f"{prefix}{i}": {t: 1 for t in rng.sample(TOOLS, rng.randint(1, 4))} for i in range(n)}


def make_dataset(qrels: dict[str, Qrels]) -> Dataset:
    queries = {qid: f"query {qid}" for split in qrels.values() for qid in split}
    corpus = {t: {"_id": t, "title": "", "text": f"tool {t}", "metadata": {}} for t in TOOLS}
    return Dataset(name="tiny", corpus=corpus, queries=queries, qrels=qrels)


def test_unit_hash_is_fixed_and_in_unit_interval() -> None:
    values = [unit_hash(3, f"k{i}") for i in range(200)]
    assert values == [unit_hash(3, f"k{i}") for i in range(200)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert unit_hash(3, "k0") != unit_hash(4, "k0")


# --- carve_validation ---------------------------------------------------------------------------------


def test_carve_validation_is_deterministic() -> None:
    train = random_qrels(300, seed=1)
    assert carve_validation(train, 0.2, seed=5) == carve_validation(train, 0.2, seed=5)
    assert carve_validation(train, 0.2, seed=5)[1] != carve_validation(train, 0.2, seed=6)[1]


def test_carve_validation_is_disjoint_and_covers_all_queries() -> None:
    train = random_qrels(300, seed=1)
    new_train, valid = carve_validation(train, 0.2, seed=0)
    assert not set(new_train) & set(valid)
    assert set(new_train) | set(valid) == set(train)
    assert all(part[qid] == train[qid] for part in (new_train, valid) for qid in part)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5])
def test_carve_validation_fraction_roughly_right(fraction: float) -> None:
    train = random_qrels(2000, seed=2)
    _, valid = carve_validation(train, fraction, seed=0)
    assert abs(len(valid) / len(train) - fraction) < 0.04


def test_carve_validation_is_stable_when_queries_are_added() -> None:
    small = random_qrels(100, seed=3)
    large = {**small, **random_qrels(100, seed=4, prefix="extra")}
    _, valid_small = carve_validation(small, 0.2, seed=0)
    _, valid_large = carve_validation(large, 0.2, seed=0)
    assert set(valid_small) == set(valid_large) & set(small)


def test_carve_validation_keeps_queries_asking_the_same_request_together() -> None:
    # 200 queries, each asked twice under two ids with other case and punctuation: without the
    # texts the twins are hashed apart and about one pair in five is split across train and valid.
    train = random_qrels(400, seed=1)
    texts = {f"q{i}": f"Request number {i % 200}" + ("?" if i >= 200 else "") for i in range(400)}
    texts |= {f"q{i}": texts[f"q{i}"].upper() for i in range(300, 400)}
    new_train, valid = carve_validation(train, 0.2, seed=0, texts=texts)
    assert 0 < len(valid) < 400 and set(new_train) | set(valid) == set(train)
    assert all((f"q{i}" in valid) == (f"q{i + 200}" in valid) for i in range(200))
    split_apart = carve_validation(train, 0.2, seed=0)[1]
    assert any((f"q{i}" in split_apart) != (f"q{i + 200}" in split_apart) for i in range(200))
    # A query with no twin is carved by its own id, as without texts.
    lone = {f"q{i}": f"lone {i}" for i in range(400)}
    assert carve_validation(train, 0.2, seed=0, texts=lone) == carve_validation(train, 0.2, seed=0)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_carve_validation_rejects_bad_fraction(fraction: float) -> None:
    with pytest.raises(ValueError, match="valid fraction"):
        carve_validation(random_qrels(10, seed=0), fraction, seed=0)


# --- cold start --------------------------------------------------------------------------------------


def test_held_out_tools_is_deterministic_and_roughly_sized() -> None:
    tools = [f"tool{i}" for i in range(2000)]
    held = held_out_tools(tools, 0.1, seed=0)
    assert held == held_out_tools(list(reversed(tools)), 0.1, seed=0)
    assert held <= set(tools)
    assert abs(len(held) / len(tools) - 0.1) < 0.03
    with pytest.raises(ValueError, match="unseen-tool fraction"):
        held_out_tools(tools, 0.0, seed=0)


def test_cold_start_moves_every_query_with_an_unseen_tool() -> None:
    qrels = {
        "train": random_qrels(200, seed=1, prefix="tr"),
        "test": random_qrels(50, seed=2, prefix="te"),
    }
    unseen = held_out_tools(TOOLS, 0.2, seed=0)
    assert unseen
    out = cold_start(qrels, unseen)
    assert set(out) == {"train", "test", "test_unseen"}
    needing = {qid for split in qrels.values() for qid, rel in split.items() if unseen & set(rel)}
    assert needing
    assert set(out["test_unseen"]) == needing
    for name in ("train", "test"):
        assert all(not unseen & set(rel) for rel in out[name].values())
        assert set(out[name]) == set(qrels[name]) - needing


def test_a_zero_judgement_of_an_unseen_tool_neither_moves_its_query_nor_stays() -> None:
    # q1 does not need b (score 0): it stays in train, without the judgement that names b, and
    # test_unseen holds only queries that need an unseen tool (q3), as its metric assumes.
    qrels = {"train": {"q1": {"a": 1, "b": 0}, "q2": {"a": 1}}, "test": {"q3": {"b": 1}}}
    out = cold_start(qrels, {"b"})
    assert out == {"train": {"q1": {"a": 1}, "q2": {"a": 1}}, "test": {}, "test_unseen": {"q3": {"b": 1}}}
    # Judged only by a zero on b, nothing of q4 is left: no empty entry (a prepared dir cannot
    # hold one, and its graphs then disagreed with its qrels).
    qrels["train"]["q4"] = {"b": 0}
    assert cold_start(qrels, {"b"})["train"] == {"q1": {"a": 1}, "q2": {"a": 1}}


def test_prepare_splits_cold_start_has_no_unseen_tool_in_train_valid_or_test() -> None:
    ds = make_dataset({"train": random_qrels(300, seed=1, prefix="tr"), "test": random_qrels(80, seed=2)})
    out = prepare_splits(ds, mode="cold_start", valid_fraction=0.2, unseen_fraction=0.2, seed=3)
    unseen = held_out_tools(sorted(ds.corpus), 0.2, seed=3)
    assert set(out.qrels) == {"train", "valid", "test", "test_unseen"}
    assert out.qrels["valid"]
    assert out.qrels["test_unseen"]
    for name in ("train", "valid", "test"):
        for rel in out.qrels[name].values():
            assert not unseen & set(rel)
    for rel in out.qrels["test_unseen"].values():
        assert unseen & set(rel)
    total = sum(len(split) for split in out.qrels.values())
    assert total == sum(len(split) for split in ds.qrels.values())


def test_cold_start_keeps_held_out_tools_out_of_the_training_scene_graph() -> None:
    # A training query's scene lists a held-out tool the query judges 0: cold_start drops the
    # judgement, but the scene-tool graph was built from the whole scene and gave the tool an edge.
    from components.data.graphs import graph_inputs

    unseen = held_out_tools(TOOLS, 0.2, seed=3)
    seen = sorted(set(TOOLS) - unseen)
    held = sorted(unseen)[0]
    train = {f"tr{i}": {seen[i % len(seen)]: 1, held: 0} for i in range(60)}
    ds = make_dataset({"train": train, "test": random_qrels(10, seed=2, prefix="te")})
    ds = replace(ds, scene_tool={"s0": [seen[0], held]}, query_scene={"train": dict.fromkeys(train, "s0")})
    out = prepare_splits(ds, mode="cold_start", valid_fraction=0.2, unseen_fraction=0.2, seed=3)
    pairs, _, _ = graph_inputs(out)["scene_tool"]
    assert pairs == [("s0", seen[0])]
    assert ds.scene_tool["s0"] == [seen[0], held]  # the input is left alone


def test_a_split_without_an_answered_query_is_refused() -> None:
    # A shipped valid the loader emptied was kept as {}: selection then ran on no query at all.
    train = random_qrels(50, seed=1)
    with pytest.raises(ValueError, match="split 'valid' has no query with a relevant tool"):
        prepare_splits(make_dataset({"train": train, "valid": {}}))
    with pytest.raises(ValueError, match="split 'valid' has no query with a relevant tool"):
        prepare_splits(make_dataset({"train": train, "valid": {"v": {"t1": 0}}}))
    with pytest.raises(ValueError, match="split 'train' has no query"):
        prepare_splits(make_dataset({"train": {}, "valid": random_qrels(5, seed=2, prefix="v")}))
    # Cold start holding out tools no query needs leaves test_unseen empty: nothing to report.
    with pytest.raises(ValueError, match=r"split 'test_unseen'.*raise splits\.unseen_fraction"):
        prepare_splits(
            make_dataset({"train": {"q": {"t0": 1}}, "valid": {"v": {"t0": 1}}}), mode="cold_start"
        )


# --- prepare_splits -----------------------------------------------------------------------------------


def test_prepare_splits_carves_valid_from_train_and_leaves_input_alone() -> None:
    ds = make_dataset({"train": random_qrels(200, seed=1), "test": random_qrels(20, seed=2, prefix="te")})
    out = prepare_splits(ds, valid_fraction=0.25, seed=0)
    assert set(out.qrels) == {"train", "valid", "test"}
    assert set(out.qrels["train"]) | set(out.qrels["valid"]) == set(ds.qrels["train"])
    assert out.qrels["test"] == ds.qrels["test"]
    assert set(ds.qrels) == {"train", "test"}
    assert len(ds.qrels["train"]) == 200


def test_prepare_splits_keeps_an_existing_valid_split() -> None:
    valid = random_qrels(10, seed=3, prefix="va")
    ds = make_dataset({"train": random_qrels(50, seed=1), "valid": valid})
    out = prepare_splits(ds, seed=0)
    assert out.qrels["valid"] == valid
    assert out.qrels["train"] == ds.qrels["train"]


@pytest.mark.parametrize("mode", ["cold", "Standard", ""])
def test_prepare_splits_rejects_bad_mode(mode: str) -> None:
    ds = make_dataset({"train": random_qrels(10, seed=1)})
    with pytest.raises(ValueError, match="split mode"):
        prepare_splits(ds, mode=mode)


def test_prepare_splits_requires_train() -> None:
    ds = make_dataset({"test": random_qrels(10, seed=1)})
    with pytest.raises(ValueError, match="no train split"):
        prepare_splits(ds)


# --- split_items --------------------------------------------------------------------------------------

ITEMS = [f"what is the weather like, take {i}" for i in range(3000)]


def test_split_items_is_deterministic_and_keeps_order() -> None:
    fractions = {"train": 0.7, "valid": 0.1, "test": 0.2}
    parts = split_items(ITEMS, fractions, seed=0)
    assert parts == split_items(ITEMS, fractions, seed=0)
    assert list(parts) == ["train", "valid", "test"]
    assert sorted(x for part in parts.values() for x in part) == sorted(ITEMS)
    for part in parts.values():
        assert part == sorted(part, key=ITEMS.index)


def test_split_items_does_not_depend_on_the_order_shares_are_listed_in() -> None:
    # Configs compare equal whatever their key order (a prepared directory is reused on that).
    listed = split_items(ITEMS, {"train": 0.8, "valid": 0.1, "test": 0.1}, seed=0)
    reordered = split_items(ITEMS, {"test": 0.1, "valid": 0.1, "train": 0.8}, seed=0)
    assert all(listed[p] == reordered[p] for p in listed)
    other = split_items(ITEMS, {"b": 0.3, "a": 0.7}, seed=0)
    assert other["a"] == split_items(ITEMS, {"a": 0.7, "b": 0.3}, seed=0)["a"]


def test_split_items_fractions_roughly_right() -> None:
    parts = split_items(ITEMS, {"a": 0.1, "b": 0.2, "c": 0.7}, seed=1)
    assert abs(len(parts["a"]) / len(ITEMS) - 0.1) < 0.03
    assert abs(len(parts["b"]) / len(ITEMS) - 0.2) < 0.03
    assert abs(len(parts["c"]) / len(ITEMS) - 0.7) < 0.03


def test_split_items_seed_changes_assignment() -> None:
    fractions = {"a": 0.5, "b": 0.5}
    assert split_items(ITEMS, fractions, seed=0) != split_items(ITEMS, fractions, seed=1)


def test_split_items_puts_repeated_items_in_one_part() -> None:
    # Hashing the text, not its position: a repeated no-tool query cannot be in train and test.
    parts = split_items(["same"] * 50 + ITEMS[:100], {"a": 0.5, "b": 0.5}, seed=0)
    assert len(parts["a"]) + len(parts["b"]) == 150
    assert sum("same" in part for part in parts.values()) == 1


def test_split_items_is_stable_when_items_are_inserted() -> None:
    fractions = {"a": 0.5, "b": 0.5}
    before = split_items(ITEMS[:500], fractions, seed=0)
    after = split_items(["a new first line", *ITEMS[:500]], fractions, seed=0)
    for name in fractions:
        assert [x for x in after[name] if x != "a new first line"] == before[name]


def test_cold_start_rejects_a_query_in_two_splits() -> None:
    with pytest.raises(ValueError, match="query 'q1' is in splits 'test' and 'train'"):
        cold_start({"test": {"q1": {"b": 1}}, "train": {"q1": {"b": 1}}}, {"b"})


def test_carve_validation_refuses_an_empty_valid_split() -> None:
    with pytest.raises(ValueError, match="carved no query out of 1 train queries"):
        carve_validation({"q0": {"a": 1}}, 0.01, seed=0)


def test_splits_from_config_rejects_unknown_keys_and_reads_neg_fractions() -> None:
    ds = make_dataset({"train": random_qrels(200, seed=1)})
    ds = replace(ds, neg_queries=ITEMS[:300])
    with pytest.raises(ValueError, match=r"unknown keys \['valid_frac'\]"):
        splits_from_config(ds, {"valid_frac": 0.2})
    out = splits_from_config(ds, {"neg_fractions": {"train": 0.5, "valid": 0.0, "test": 0.5}})
    assert out.neg_split["valid"] == []
    assert len(out.neg_split["train"]) + len(out.neg_split["test"]) == 300


@pytest.mark.parametrize("fractions", [{"a": 0.5, "b": 0.4}, {"a": 0.6, "b": 0.6}, {}])
def test_split_items_fractions_must_sum_to_one(fractions: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        split_items(ITEMS, fractions, seed=0)


def test_split_items_zero_share_part_is_empty() -> None:
    parts = split_items(ITEMS[:200], {"a": 1.0, "b": 0.0}, seed=0)
    assert parts == {"a": ITEMS[:200], "b": []}


def test_near_identical_texts_go_to_one_part_and_the_rest_stay_where_they_were() -> None:
    from components.data.splits import split_items, unit_hash

    twins = [
        "How are you today?",
        "how are you today ",
        "Hi, how are you?",
        "hi how are you",
        "HI HOW ARE YOU",
    ]
    others = [f"what is {n} times {n + 1}" for n in range(200)]
    parts = split_items(twins + others, {"train": 0.5, "test": 0.5}, seed=3)
    where = {text: part for part, texts in parts.items() for text in texts}
    # Texts that differ only in case, punctuation or spacing are one request: never in two parts.
    assert where[twins[0]] == where[twins[1]] and len({where[t] for t in twins[2:]}) == 1
    # Any other text is hashed as itself, as before: its part is where its own hash puts it.
    assert all(where[t] == ("train" if unit_hash(3, t) < 0.5 else "test") for t in others)


@pytest.mark.parametrize("mode", ["standard", "cold_start"])
def test_a_holdout_carved_for_a_growing_dataset_is_the_one_prepare_splits_carves(mode) -> None:
    # A retrain carves the base's holdout before merging an increment that brings valid. In cold
    # start it carved from all of train, and a twin group's first query (one that needs a held-out
    # tool, moved to test_unseen later) put its twin in the holdout although the champion, split by
    # prepare_splits, trained on it.
    from components.data.splits import with_holdout

    settings = {"mode": mode, "valid_fraction": 0.1, "unseen_fraction": 0.1, "seed": 0}
    unseen = sorted(held_out_tools(TOOLS, 0.1, 0))
    seen = [t for t in TOOLS if t not in unseen]
    first = next(f"a{i}" for i in range(10000) if unit_hash(0, f"a{i}") < 0.1)
    twin = next(f"b{i}" for i in range(10000) if unit_hash(0, f"b{i}") >= 0.1)
    others = {f"o{i}": {seen[i % len(seen)]: 1} for i in range(200)}
    ds = make_dataset({"train": {first: {unseen[0]: 1}, twin: {seen[0]: 1}, **others}})
    ds = replace(ds, queries={**ds.queries, first: "Weather in Paris", twin: "weather in paris?"})
    champion = prepare_splits(ds, mode=mode, valid_fraction=0.1, unseen_fraction=0.1, seed=0)
    carved = with_holdout(ds, settings)
    assert not set(champion.qrels["train"]) & set(carved.qrels["valid"])
    assert set(carved.qrels["valid"]) == set(champion.qrels["valid"])
