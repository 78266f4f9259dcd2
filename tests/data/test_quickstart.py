"""The synthetic quickstart dataset: deterministic, loads cleanly, and is neither trivial nor hopeless.

Validation and test queries must be worded in ways no training query is (held-out templates, and
for test held-out openers and joins too), and that wording must be learnable from training queries
while unlike the tool descriptions; the last test checks both with two cheap lexical retrievers.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from components.data import quickstart_phrasing as wording
from components.data.loader import load_dataset
from components.data.quickstart import Tool, build_tools, generate_quickstart
from components.data.quickstart_catalog import SLOT_ALIASES, SLOTS
from components.data.quickstart_phrasing import HELD_OUT_TEMPLATES
from components.data.rejects import RejectLog
from components.data.tooltext import parse_tool_text
from components.data.types import Dataset

FILES = (
    "corpus.jsonl",
    "queries.jsonl",
    "qrels/train.tsv",
    "qrels/valid.tsv",
    "qrels/test.tsv",
    "query_scene_train.txt",
    "query_scene_valid.txt",
    "query_scene_test.txt",
    "scene_tool.txt",
    "tooldet/neg_queries.jsonl",
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """The dataset ``toolscout run`` generates, shared by the read-only tests."""
    root = tmp_path_factory.mktemp("quickstart")
    return root, generate_quickstart(str(root), seed=0, wording="held_out")


@pytest.fixture(scope="module")
def loaded(generated: tuple[Path, dict[str, int]]) -> tuple[Dataset, RejectLog]:
    log = RejectLog()
    return load_dataset(str(generated[0]), log=log), log


@pytest.mark.parametrize("wording", ["held_out", "shared"])
def test_same_seed_gives_identical_bytes(tmp_path: Path, wording: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    kwargs = {"seed": 3, "n_queries": 400, "n_neg": 50, "wording": wording}
    assert generate_quickstart(str(a), **kwargs) == generate_quickstart(str(b), **kwargs)
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    expected = set(FILES) - ({"qrels/valid.tsv", "query_scene_valid.txt"} if wording == "shared" else set())
    assert set(files) == expected
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_different_seed_gives_different_queries(tmp_path: Path) -> None:
    generate_quickstart(str(tmp_path / "a"), seed=1, n_queries=400, n_neg=50, wording="held_out")
    generate_quickstart(str(tmp_path / "b"), seed=2, n_queries=400, n_neg=50, wording="held_out")
    for rel in ("queries.jsonl", "qrels/valid.tsv", "qrels/test.tsv", "tooldet/neg_queries.jsonl"):
        assert (tmp_path / "a" / rel).read_bytes() != (tmp_path / "b" / rel).read_bytes(), rel
    # The catalogue does not depend on the seed.
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() == (tmp_path / "b" / "corpus.jsonl").read_bytes()


def test_loads_with_zero_rejects(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, log = loaded
    assert len(log) == 0, [str(r) for r in log.sorted()[:5]]
    assert not log.notes
    assert sorted(ds.qrels) == ["test", "train", "valid"]


def test_counts_match_files(
    generated: tuple[Path, dict[str, int]], loaded: tuple[Dataset, RejectLog]
) -> None:
    _, counts = generated
    ds, _ = loaded
    assert counts["tools"] == len(ds.corpus)
    assert counts["queries"] == len(ds.queries) == 3000
    assert counts["neg_queries"] == len(ds.neg_queries) == 300
    for split in ("train", "valid", "test"):
        assert counts[f"{split}_queries"] == len(ds.qrels[split])
        assert counts[f"{split}_pairs"] == sum(len(v) for v in ds.qrels[split].values())
    for split in ("valid", "test"):
        assert 0.07 <= counts[f"{split}_queries"] / counts["queries"] <= 0.13
    assert sum(counts[f"{s}_queries"] for s in ("train", "valid", "test")) == counts["queries"]
    assert not set(ds.qrels["train"]) & set(ds.qrels["valid"])
    assert not set(ds.qrels["train"]) & set(ds.qrels["test"])
    assert not set(ds.qrels["valid"]) & set(ds.qrels["test"])


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
    assert len(negs) == 300
    assert all(isinstance(q, str) and q.strip() for q in negs)
    assert len(set(negs)) == 300


def request_of(query: str) -> str:
    """A no-tool query without its opener, closer and capital (what it asks)."""
    for prefix in sorted(wording.PREFIXES_SEEN, key=len, reverse=True):
        if prefix and query.lower().startswith(prefix.lower()):
            query = query[len(prefix) :]
            break
    for suffix in sorted(wording.SUFFIXES_SEEN, key=len, reverse=True):
        if suffix and query.endswith(suffix):
            query = query[: -len(suffix)]
            break
    return query[:1].lower() + query[1:]


def test_no_test_negative_is_a_training_one_rewrapped(loaded: tuple[Dataset, RejectLog]) -> None:
    from components.data.splits import prepare_splits

    ds = prepare_splits(loaded[0])  # no-tool queries are split by the loader, by text
    requests = {split: Counter(map(request_of, ds.neg_split[split])) for split in ("train", "test")}
    assert sum(requests["test"].values()) >= 20
    # Each request is asked once: detection is scored on requests it never saw, as retrieval is.
    assert not set(requests["test"]) & set(requests["train"])
    assert max(requests["train"].values()) == 1
    # Templates are drawn evenly: arithmetic (endless fresh numbers) does not crowd out the rest.
    arithmetic = sum(bool(re.search(r"\d", r)) for r in map(request_of, ds.neg_queries))
    assert arithmetic < 0.4 * len(ds.neg_queries)


def test_regenerating_into_a_dir_named_like_a_pattern_leaves_no_stale_split(tmp_path: Path) -> None:
    root = tmp_path / "qs[1]"
    generate_quickstart(str(root), seed=0, n_queries=200, n_neg=20, wording="held_out")
    assert (root / "qrels" / "valid.tsv").exists()
    generate_quickstart(str(root), seed=5, n_queries=200, n_neg=20, wording="shared")
    # An old valid split would label new queries with old tools (and take them out of train).
    assert not (root / "qrels" / "valid.tsv").exists() and not (root / "query_scene_valid.txt").exists()


def test_queries_are_not_one_string_per_tool(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, _ = loaded
    texts: dict[str, set[str]] = {}
    for qrels in ds.qrels.values():
        for qid, tools in qrels.items():
            if len(tools) == 1:
                texts.setdefault(next(iter(tools)), set()).add(ds.queries[qid])
    assert min(len(v) for v in texts.values()) >= 3


def template_pattern(template: str) -> re.Pattern[str]:
    """A template as a regex: its literal text, each slot any value of the slot's pool.

    The generator drops a sub-request's trailing "?" and may capitalise its first letter.
    """
    parts = re.split(r"\{(\w+)\}", template.rstrip("?"))
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            pool = SLOT_ALIASES.get(part, part)
            values = SLOTS[pool if pool in SLOTS else pool.rstrip("2")]
            out.append("(?:" + "|".join(map(re.escape, values)) + ")")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out), re.IGNORECASE)


def templates_used(ds: Dataset, split: str, tools: dict[str, Tool]) -> dict[str, set[str]]:
    """Per tool, the templates whose text is found in the split's queries that need the tool."""
    patterns = {t: template_pattern(t) for tool in tools.values() for t in tool.wordings}
    used: dict[str, set[str]] = defaultdict(set)
    for qid, rel in ds.qrels[split].items():
        for tid in rel:
            found = {t for t in tools[tid].wordings if patterns[t].search(ds.queries[qid])}
            # Every request is recognised, or an empty set would make the disjointness below vacuous.
            assert found, (split, ds.queries[qid], tools[tid].api)
            used[tid] |= found
    return used


def test_each_split_uses_templates_no_other_split_uses(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, _ = loaded
    tools = {t.tid: t for t in build_tools()}
    used = {split: templates_used(ds, split, tools) for split in ("train", "valid", "test")}
    for a, b in (("test", "train"), ("test", "valid"), ("valid", "train")):
        for tid, templates in used[a].items():
            assert not templates & used[b][tid], (a, b, tools[tid].api, templates & used[b][tid])
    # Each split keeps to its share of a tool's templates, and training uses nearly all of its share.
    share = {tid: len(t.wordings) - sum(HELD_OUT_TEMPLATES.values()) for tid, t in tools.items()}
    assert all(len(used["train"][tid]) <= share[tid] for tid in tools)
    assert sum(len(v) for v in used["train"].values()) >= 0.95 * sum(share.values())
    for split in ("valid", "test"):
        assert all(len(v) <= HELD_OUT_TEMPLATES[split] for v in used[split].values())
        assert len(used[split]) >= 0.8 * len(tools)  # most tools are asked for


def test_shared_wording_words_train_and_test_alike_from_the_catalogue_templates(tmp_path: Path) -> None:
    generate_quickstart(str(tmp_path), seed=0, n_queries=1500, n_neg=50, wording="shared")
    ds = load_dataset(str(tmp_path))
    assert sorted(ds.qrels) == ["test", "train"]  # valid is the loader's to carve
    tools = {t.tid: t for t in build_tools()}
    train, test = templates_used(ds, "train", tools), templates_used(ds, "test", tools)
    assert all(v <= set(tools[tid].templates) for tid, v in (train | test).items())
    assert sum(len(test[tid] & train[tid]) for tid in test) >= 0.8 * sum(len(v) for v in test.values())


def test_regenerating_into_a_used_directory_leaves_no_split_of_the_old_data(tmp_path: Path) -> None:
    # held_out writes a valid split, shared does not: the old valid ids must not survive the second
    # run, where they would name train and test queries of the new data.
    generate_quickstart(str(tmp_path), seed=0, n_queries=200, n_neg=20, wording="held_out")
    generate_quickstart(str(tmp_path), seed=0, n_queries=200, n_neg=20, wording="shared")
    assert not (tmp_path / "qrels" / "valid.tsv").exists()
    assert not (tmp_path / "query_scene_valid.txt").exists()
    ds = load_dataset(str(tmp_path))
    assert sorted(ds.qrels) == ["test", "train"]


def test_test_queries_use_openers_no_other_query_uses(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, _ = loaded
    seen = {p.lower() for p in wording.PREFIXES_SEEN if p}
    held_out = {p.lower() for p in wording.PREFIXES_HELD_OUT if p}
    assert seen and held_out and not seen & held_out
    assert not set(wording.CONNECTORS_SEEN) & set(wording.CONNECTORS_HELD_OUT)
    assert not {s for s in wording.SUFFIXES_SEEN if s} & set(wording.SUFFIXES_HELD_OUT)

    def openers(split: str) -> Counter[str]:
        return Counter(
            p for q in ds.qrels[split] for p in seen | held_out if ds.queries[q].lower().startswith(p)
        )

    train, valid, test = openers("train"), openers("valid"), openers("test")
    assert set(train) | set(valid) <= seen and set(test) <= held_out
    assert len(test) >= 3 and len(train) >= 3  # both sides do use openers
    assert not {ds.queries[q] for q in ds.qrels["train"]} & {ds.queries[q] for q in ds.qrels["test"]}


def test_multi_tool_queries_are_in_test_too(loaded: tuple[Dataset, RejectLog]) -> None:
    ds, _ = loaded
    sizes = Counter(len(v) for v in ds.qrels["test"].values())
    assert sizes[2] + sizes[3] >= 0.25 * sum(sizes.values()), sizes
    assert sizes[3] > 0, sizes


def test_every_catalogue_api_has_templates_to_hold_out() -> None:
    for tool in build_tools():
        assert len(set(tool.wordings)) == len(tool.wordings) >= sum(HELD_OUT_TEMPLATES.values()) + 3


def bm25_ndcg3(corpus: dict, ds: Dataset, split: str, tools_of: dict[str, set[str]] | None = None) -> float:
    """NDCG@3 of BM25 over ``corpus``; with ``tools_of``, hits are documents voting for their tools."""
    from components.methods import build
    from components.metrics import evaluate_retrieval

    method = build("bm25", {"profile": "default"})
    method.index(corpus)
    results = method.retrieve(ds.split_queries(split), 10)
    if tools_of is not None:
        votes: dict[str, dict[str, float]] = {}
        for qid, hits in results.items():
            tally: Counter[str] = Counter()
            for doc, score in hits.items():
                for tid in tools_of[doc]:
                    tally[tid] += score
            votes[qid] = dict(tally)
        results = votes
    return evaluate_retrieval(ds.qrels[split], results)["ndcg@3"]


def test_wording_is_learnable_from_training_queries_but_unlike_the_descriptions(
    loaded: tuple[Dataset, RejectLog],
) -> None:
    ds, _ = loaded
    # BM25 on the tool documents: lexical overlap with the descriptions alone.
    on_tools = bm25_ndcg3(ds.corpus, ds, "test")
    # BM25 on the training queries, each voting for its tools: what the training wording teaches.
    memory = {q: {"title": "", "text": ds.queries[q]} for q in ds.qrels["train"]}
    tools_of = {q: set(rel) for q, rel in ds.qrels["train"].items()}
    from_train = bm25_ndcg3(memory, ds, "test", tools_of)
    # Learned retrievers need room above BM25; a near-zero score would mean broken queries.
    assert 0.25 <= on_tools <= 0.55, on_tools
    # Held-out wording shares vocabulary with training queries (learnable) but not their strings.
    assert from_train >= on_tools + 0.15, (from_train, on_tools)
    assert from_train <= 0.85, from_train


@pytest.mark.parametrize(
    ("n_queries", "n_neg", "wording"), [(9, 10, "shared"), (100, -1, "shared"), (100, 10, "x")]
)
def test_rejects_bad_arguments(tmp_path: Path, n_queries: int, n_neg: int, wording: str) -> None:
    with pytest.raises(ValueError):
        generate_quickstart(str(tmp_path), n_queries=n_queries, n_neg=n_neg, wording=wording)
