"""The synthetic quickstart dataset: deterministic, loads cleanly, and is neither trivial nor hopeless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.data.loader import load_dataset
from components.data.quickstart import generate_quickstart
from components.data.rejects import RejectLog
from components.data.tooltext import parse_tool_text
from components.data.types import Dataset

FILES = (
    "corpus.jsonl",
    "queries.jsonl",
    "qrels/train.tsv",
    "qrels/test.tsv",
    "query_scene_train.txt",
    "query_scene_test.txt",
    "scene_tool.txt",
    "tooldet/neg_queries.jsonl",
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """One default-size dataset shared by the read-only tests (generation is the slow part)."""
    root = tmp_path_factory.mktemp("quickstart")
    return root, generate_quickstart(str(root), seed=0)


@pytest.fixture(scope="module")
def loaded(generated: tuple[Path, dict[str, int]]) -> tuple[Dataset, RejectLog]:
    log = RejectLog()
    return load_dataset(str(generated[0]), log=log), log


def test_same_seed_gives_identical_bytes(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert generate_quickstart(str(a), seed=3, n_queries=400, n_neg=50) == generate_quickstart(
        str(b), seed=3, n_queries=400, n_neg=50
    )
    for rel in FILES:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_different_seed_gives_different_queries(tmp_path: Path) -> None:
    generate_quickstart(str(tmp_path / "a"), seed=1, n_queries=400, n_neg=50)
    generate_quickstart(str(tmp_path / "b"), seed=2, n_queries=400, n_neg=50)
    for rel in ("queries.jsonl", "qrels/test.tsv", "tooldet/neg_queries.jsonl"):
        assert (tmp_path / "a" / rel).read_bytes() != (tmp_path / "b" / rel).read_bytes(), rel
    # The catalogue does not depend on the seed.
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() == (tmp_path / "b" / "corpus.jsonl").read_bytes()


def test_loads_with_zero_rejects(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, log = loaded
    assert len(log) == 0, [str(r) for r in log.sorted()[:5]]
    assert not log.notes
    assert sorted(ds.qrels) == ["test", "train"]


def test_counts_match_files(
    generated: tuple[Path, dict[str, int]], loaded: tuple[Dataset, RejectLog]
) -> None:
    _, counts = generated
    ds, _ = loaded
    assert counts["tools"] == len(ds.corpus)
    assert counts["queries"] == len(ds.queries) == 3000
    assert counts["neg_queries"] == len(ds.neg_queries) == 600
    for split in ("train", "test"):
        assert counts[f"{split}_queries"] == len(ds.qrels[split])
        assert counts[f"{split}_pairs"] == sum(len(v) for v in ds.qrels[split].values())
    assert 0.07 <= counts["test_queries"] / counts["queries"] <= 0.13
    assert not set(ds.qrels["train"]) & set(ds.qrels["test"])


def test_ids_are_consecutive_integer_strings(generated: tuple[Path, dict[str, int]]) -> None:
    root, _ = generated
    for rel in ("corpus.jsonl", "queries.jsonl"):
        ids = [json.loads(line)["_id"] for line in (root / rel).read_text().splitlines()]
        assert ids == [str(i) for i in range(len(ids))], rel


def test_about_a_hundred_tools_in_eight_or_more_categories(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, _ = loaded
    tools = [parse_tool_text(tid, rec["text"]) for tid, rec in ds.corpus.items()]
    assert 80 <= len(tools) <= 120
    assert len({t.category for t in tools}) >= 8
    assert len({(t.tool, t.api) for t in tools}) == len(tools)


def test_every_tool_text_parses(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, _ = loaded
    for tid, rec in ds.corpus.items():
        tool = parse_tool_text(tid, rec["text"])
        assert tool.category and tool.tool and tool.api and tool.description, rec["text"]
        assert all(p.get("name") and p.get("type") for p in tool.required_params + tool.optional_params)
        assert json.loads(tool.return_schema)


def test_multi_tool_queries_follow_their_scenes(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, _ = loaded
    sizes = [len(v) for split in ds.qrels.values() for v in split.values()]
    assert set(sizes) <= {1, 2, 3}
    assert 0.3 <= sum(s > 1 for s in sizes) / len(sizes) <= 0.5
    for split, qrels in ds.qrels.items():
        assert set(ds.query_scene[split]) == set(qrels)
        for qid, tools in qrels.items():
            assert sorted(ds.scene_tool[ds.query_scene[split][qid]]) == sorted(tools)


def test_no_duplicate_pairs(generated: tuple[Path, dict[str, int]]) -> None:
    root, _ = generated
    for rel in ("qrels/train.tsv", "qrels/test.tsv", "scene_tool.txt"):
        rows = (root / rel).read_text().splitlines()
        assert len(rows) == len(set(rows)), rel


def test_neg_queries_are_varied_json_strings(generated: tuple[Path, dict[str, int]]) -> None:
    root, _ = generated
    negs = [json.loads(line) for line in (root / "tooldet/neg_queries.jsonl").read_text().splitlines()]
    assert len(negs) == 600
    assert all(isinstance(q, str) and q.strip() for q in negs)
    assert len(set(negs)) >= 200


def test_queries_are_not_one_string_per_tool(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, _ = loaded
    texts: dict[str, set[str]] = {}
    for qrels in ds.qrels.values():
        for qid, tools in qrels.items():
            if len(tools) == 1:
                texts.setdefault(next(iter(tools)), set()).add(ds.queries[qid])
    assert min(len(v) for v in texts.values()) >= 3


def test_bm25_recall_is_in_a_useful_range(loaded: tuple[Dataset, RejectLog]) -> None:
    from components.methods.bm25.method import BM25Method
    from components.metrics import evaluate_retrieval

    ds, _ = loaded
    method = BM25Method()
    method.index(ds.corpus)
    results = method.retrieve(ds.split_queries("test"), 10)
    recall = evaluate_retrieval(ds.qrels["test"], results)["recall@3"]
    # Learned retrievers need room above BM25; a near-zero score would mean broken queries.
    assert 0.3 <= recall <= 0.85, recall


@pytest.mark.parametrize(("n_queries", "n_neg"), [(9, 10), (100, -1)])
def test_rejects_bad_sizes(tmp_path: Path, n_queries: int, n_neg: int) -> None:
    with pytest.raises(ValueError):
        generate_quickstart(str(tmp_path), n_queries=n_queries, n_neg=n_neg)
