"""Bad-input cases of ``load_dataset``: every bad row is rejected with file, line and reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from components.data.loader import load_dataset
from components.data.rejects import DatasetError, RejectLog, StrictModeError
from components.data.types import Dataset

QRELS_HEADER = "query-id\tcorpus-id\tscore\n"


def jsonl(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


CORPUS = jsonl(
    {"_id": "t1", "title": "One", "text": "first tool"},
    {"_id": "t2", "title": "Two", "text": "second tool"},
    {"_id": "t3", "title": "Three", "text": "third tool"},
)
QUERIES = jsonl(
    {"_id": "q1", "text": "first query"},
    {"_id": "q2", "text": "second query"},
    {"_id": "q3", "text": "third query"},
)
TRAIN = QRELS_HEADER + "q1\tt1\t1\nq2\tt2\t1\n"
TEST = QRELS_HEADER + "q3\tt3\t1\n"


def make_dataset(root: Path, files: dict[str, str | bytes | None] | None = None) -> str:
    """Write a tiny valid BEIR dataset; ``files`` replaces (or, with None, removes) files by path."""
    contents: dict[str, str | bytes | None] = {
        "corpus.jsonl": CORPUS,
        "queries.jsonl": QUERIES,
        "qrels/train.tsv": TRAIN,
        "qrels/test.tsv": TEST,
    }
    contents.update(files or {})
    for rel, value in contents.items():
        if value is None:
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value if isinstance(value, bytes) else value.encode())
    return str(root)


def assert_one_reject(root: str, file: str, line: int, reason: str) -> tuple[Dataset, RejectLog]:
    """Load leniently, check the single reject, then check that strict mode names file:line."""
    log = RejectLog()
    ds = load_dataset(root, log=log)
    assert [(r.file, r.line) for r in log.rejects] == [(file, line)], log.rejects
    assert reason in log.rejects[0].reason
    with pytest.raises(StrictModeError, match=re.escape(f"{file}:{line}: ")):
        load_dataset(root, strict=True)
    return ds, log


def assert_good_rows(ds: Dataset) -> None:
    assert sorted(ds.corpus) == ["t1", "t2", "t3"]
    assert ds.corpus["t1"]["text"] == "first tool"
    assert ds.queries == {"q1": "first query", "q2": "second query", "q3": "third query"}
    assert ds.qrels == {"train": {"q1": {"t1": 1}, "q2": {"t2": 1}}, "test": {"q3": {"t3": 1}}}


def test_valid_dataset_loads_without_rejects(tmp_path: Path) -> None:
    log = RejectLog()
    ds = load_dataset(make_dataset(tmp_path), log=log, strict=True)
    assert len(log) == 0
    assert_good_rows(ds)
    assert ds.name == tmp_path.name


# --- corpus.jsonl / queries.jsonl rows --------------------------------------------------------------


def test_malformed_json_line(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + '{"_id": "t4", "text": \n'})
    ds, _ = assert_one_reject(root, "corpus.jsonl", 4, "malformed JSON")
    assert_good_rows(ds)


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + '["t4", "a tool"]\n'})
    ds, _ = assert_one_reject(root, "corpus.jsonl", 4, "expected a JSON object, got list")
    assert_good_rows(ds)


def test_missing_id(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"queries.jsonl": QUERIES + jsonl({"text": "no id"})})
    ds, _ = assert_one_reject(root, "queries.jsonl", 4, "missing field '_id'")
    assert_good_rows(ds)


def test_missing_text(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + jsonl({"_id": "t4", "title": "Four"})})
    ds, _ = assert_one_reject(root, "corpus.jsonl", 4, "missing field 'text'")
    assert_good_rows(ds)


@pytest.mark.parametrize("text", ["", "   ", "\t\n "])
def test_empty_or_whitespace_text(tmp_path: Path, text: str) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + jsonl({"_id": "t4", "text": text})})
    ds, _ = assert_one_reject(root, "corpus.jsonl", 4, "empty 'text'")
    assert_good_rows(ds)


@pytest.mark.parametrize(("text", "type_name"), [(5, "int"), (["a"], "list"), (None, "NoneType")])
def test_non_string_text(tmp_path: Path, text: object, type_name: str) -> None:
    root = make_dataset(tmp_path, {"queries.jsonl": QUERIES + jsonl({"_id": "q4", "text": text})})
    ds, _ = assert_one_reject(root, "queries.jsonl", 4, f"'text' must be a string, got {type_name}")
    assert_good_rows(ds)


@pytest.mark.parametrize("bad_id", [["t4"], True, False, None, 1.5, {"a": 1}, "", "  "])
def test_bad_id_type(tmp_path: Path, bad_id: object) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + jsonl({"_id": bad_id, "text": "a tool"})})
    ds, _ = assert_one_reject(root, "corpus.jsonl", 4, "'_id' must be a non-empty string or integer")
    assert_good_rows(ds)


@pytest.mark.parametrize("bad_id", ["t\t4", "t4\n", "t\r4"])
def test_an_id_no_qrels_row_could_name_is_rejected_in_its_own_file(tmp_path: Path, bad_id: str) -> None:
    # Accepted, it could never be judged (qrels rows are tab-separated lines), and a qrels row
    # trying would be blamed for the column count instead.
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + jsonl({"_id": bad_id, "text": "a tool"})})
    ds, _ = assert_one_reject(root, "corpus.jsonl", 4, "'_id' must not contain a tab or line break")
    assert_good_rows(ds)


def test_integer_id_is_accepted_as_string(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + jsonl({"_id": 4, "text": "a tool"})})
    log = RejectLog()
    ds = load_dataset(root, log=log)
    assert len(log) == 0
    assert ds.corpus["4"]["_id"] == "4"


def test_duplicate_tool_id_keeps_first(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + jsonl({"_id": "t1", "text": "impostor"})})
    ds, _ = assert_one_reject(root, "corpus.jsonl", 4, "duplicate _id 't1' (first at line 1)")
    assert_good_rows(ds)
    assert ds.corpus["t1"]["text"] == "first tool"


def test_duplicate_query_id_keeps_first(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"queries.jsonl": QUERIES + jsonl({"_id": "q2", "text": "again"})})
    ds, _ = assert_one_reject(root, "queries.jsonl", 4, "duplicate _id 'q2' (first at line 2)")
    assert_good_rows(ds)


# --- qrels -----------------------------------------------------------------------------------------


def test_qrels_unknown_query(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"qrels/train.tsv": TRAIN + "q9\tt1\t1\n"})
    ds, _ = assert_one_reject(root, "qrels/train.tsv", 4, "unknown query-id 'q9'")
    assert_good_rows(ds)


def test_qrels_unknown_tool(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"qrels/train.tsv": TRAIN + "q1\tt9\t1\n"})
    ds, _ = assert_one_reject(root, "qrels/train.tsv", 4, "unknown corpus-id 't9'")
    assert_good_rows(ds)


@pytest.mark.parametrize(
    ("score", "reason"),
    [
        ("x", "score must be an integer, got 'x'"),
        ("1.5", "must be an integer"),
        ("-1", "score must be >= 0"),
        # int() reads these as 10 and 1: a typo or another script's digit would load as a relevance.
        ("1_0", "score must be an integer, got '1_0'"),
        ("\u0661", "score must be an integer"),
    ],
)
def test_qrels_bad_score(tmp_path: Path, score: str, reason: str) -> None:
    root = make_dataset(tmp_path, {"qrels/train.tsv": TRAIN + f"q1\tt2\t{score}\n"})
    ds, _ = assert_one_reject(root, "qrels/train.tsv", 4, reason)
    assert_good_rows(ds)


@pytest.mark.parametrize(("row", "n"), [("q1\tt2", 2), ("q1\tt2\t1\t7", 4), ("q1 t2 1", 1)])
def test_qrels_wrong_column_count(tmp_path: Path, row: str, n: int) -> None:
    root = make_dataset(tmp_path, {"qrels/test.tsv": TEST + row + "\n"})
    ds, _ = assert_one_reject(
        root, "qrels/test.tsv", 3, f"expected 3 tab-separated columns (query-id, corpus-id, score), got {n}"
    )
    assert_good_rows(ds)


def test_qrels_conflicting_duplicate_pair_rejected(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"qrels/train.tsv": TRAIN + "q1\tt1\t2\n"})
    ds, log = assert_one_reject(root, "qrels/train.tsv", 4, "conflicting score for pair (q1, t1): 1")
    assert_good_rows(ds)
    assert ds.qrels["train"]["q1"] == {"t1": 1}
    assert not log.notes


def test_qrels_identical_duplicate_pair_merged_not_rejected(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"qrels/train.tsv": TRAIN + "q1\tt1\t1\nq2\tt2\t1\n"})
    log = RejectLog()
    ds = load_dataset(root, log=log, strict=True)
    assert len(log) == 0
    assert_good_rows(ds)
    assert log.notes == {"qrels/train.tsv: merged duplicate pairs": 2}


def test_a_test_query_repeating_a_train_querys_text_is_counted_and_kept(tmp_path: Path) -> None:
    # q3 asks q1's request again under another id ("First query!" vs "first query"): kept as given,
    # counted in the notes, so a score on test is known to include requests seen in training.
    queries = QUERIES.replace('"third query"', '"First  query!"')
    log = RejectLog()
    ds = load_dataset(make_dataset(tmp_path, {"queries.jsonl": queries}), log=log, strict=True)
    assert len(log) == 0 and ds.qrels["test"] == {"q3": {"t3": 1}}
    assert log.notes == {"qrels/test.tsv: queries repeating a train query's text under another id": 1}


def test_a_query_judged_in_train_and_test_stays_in_test_only(tmp_path: Path) -> None:
    # Kept in train too, a model would train on a query it is scored on.
    root = make_dataset(tmp_path, {"qrels/train.tsv": TRAIN + "q3\tt1\t1\n"})
    ds, _ = assert_one_reject(root, "qrels/train.tsv", 4, "query-id 'q3' is judged in qrels/test.tsv too")
    assert_good_rows(ds)


def test_a_row_is_rejected_once_though_two_rules_refuse_it(tmp_path: Path) -> None:
    # q3's second train row conflicts with its first, and q3 is judged in test too: that row was
    # in rejects.jsonl twice. And rejects count by reason, not one reason per id.
    root = make_dataset(tmp_path, {"qrels/train.tsv": TRAIN + "q3\tt1\t1\nq3\tt1\t0\nq9\tt1\t1\nq8\tt1\t1\n"})
    log = RejectLog()
    load_dataset(root, log=log)
    lines = [r.line for r in log.rejects if r.file == "qrels/train.tsv"]
    assert sorted(lines) == sorted(set(lines)) == [4, 5, 6, 7]
    reasons = log.reason_counts()
    assert reasons["unknown query-id …"] == 2 and sum(reasons.values()) == 4, reasons


def test_qrels_header_is_optional(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"qrels/train.tsv": "q1\tt1\t1\nq2\tt2\t1\n"})
    assert_good_rows(load_dataset(root, strict=True))


# --- encodings ---------------------------------------------------------------------------------------


def test_invalid_utf8_rejects_only_that_line(tmp_path: Path) -> None:
    lines = CORPUS.encode().splitlines(keepends=True)
    bad = b'{"_id": "t9", "text": "caf\xe9 \xff"}\n'
    root = make_dataset(tmp_path, {"corpus.jsonl": lines[0] + bad + b"".join(lines[1:])})
    ds, log = assert_one_reject(root, "corpus.jsonl", 2, "not valid UTF-8")
    assert_good_rows(ds)
    assert "t9" not in ds.corpus
    assert log.rejects[0].content == '{"_id": "t9", "text": "caf\\xe9 \\xff"}'


def test_an_escaped_lone_surrogate_is_rejected_with_its_line(tmp_path: Path) -> None:
    # Valid JSON and valid UTF-8 bytes, but "\\ud83d" alone decodes to half an emoji, which Arrow and
    # Parquet cannot write: rejected here, on both paths, not as a crash of the Ray job.
    bad = '{"_id": "t9", "text": "weather api \\ud83d"}\n'
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + bad})
    ds, _ = assert_one_reject(root, "corpus.jsonl", 4, "'text' holds an unpaired surrogate")
    assert_good_rows(ds)
    assert "t9" not in ds.corpus


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    root = make_dataset(
        tmp_path,
        {
            "corpus.jsonl": bom + CORPUS.encode(),
            "queries.jsonl": bom + QUERIES.encode(),
            "qrels/train.tsv": bom + TRAIN.encode(),
        },
    )
    log = RejectLog()
    ds = load_dataset(root, log=log, strict=True)
    assert len(log) == 0
    assert_good_rows(ds)


def test_crlf_line_endings_are_accepted(tmp_path: Path) -> None:
    root = make_dataset(
        tmp_path,
        {"corpus.jsonl": CORPUS.replace("\n", "\r\n"), "qrels/train.tsv": TRAIN.replace("\n", "\r\n")},
    )
    assert_good_rows(load_dataset(root, strict=True))


# --- whole-file errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n\n  \n", "\ufeff", "\ufeff\n"])
def test_empty_corpus_file_raises(tmp_path: Path, content: str) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": content})
    with pytest.raises(DatasetError, match=r"corpus\.jsonl: file is empty"):
        load_dataset(root)


def test_corpus_with_no_valid_rows_raises(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": "not json\n[]\n"})
    with pytest.raises(DatasetError, match=r"corpus\.jsonl: no valid rows"):
        load_dataset(root)


def test_missing_corpus_file_raises(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": None})
    with pytest.raises(DatasetError, match=r"corpus\.jsonl: required file is missing"):
        load_dataset(root)


def test_missing_queries_file_raises(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"queries.jsonl": None})
    with pytest.raises(DatasetError, match=r"queries\.jsonl: required file is missing"):
        load_dataset(root)


def test_requested_split_missing_lists_available(tmp_path: Path) -> None:
    root = make_dataset(tmp_path)
    with pytest.raises(
        DatasetError, match=re.escape("split(s) ['valid'] not found; available: ['test', 'train']")
    ):
        load_dataset(root, splits=["train", "valid"])


def test_requested_split_subset_loads_only_that_split(tmp_path: Path) -> None:
    ds = load_dataset(make_dataset(tmp_path), splits=["test"])
    assert ds.qrels == {"test": {"q3": {"t3": 1}}}
    # data.splits=test from the command line is one name (it was read as ['t', 'e', 's', 't']).
    assert load_dataset(make_dataset(tmp_path / "b"), splits="test").qrels == ds.qrels
    assert load_dataset(make_dataset(tmp_path / "c"), splits=["test", "test"]).qrels == ds.qrels


def test_no_qrels_at_all_raises(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"qrels/train.tsv": None, "qrels/test.tsv": None})
    with pytest.raises(DatasetError, match="no qrels"):
        load_dataset(root)


# --- scenes and no-tool queries ----------------------------------------------------------------------


def test_scene_tool_unknown_tool(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"scene_tool.txt": "s1 t1\ns1 t2\ns2 t3\ns3 t9\n"})
    ds, _ = assert_one_reject(root, "scene_tool.txt", 4, "unknown tool-id 't9'")
    assert_good_rows(ds)
    assert ds.scene_tool == {"s1": ["t1", "t2"], "s2": ["t3"]}


def test_query_scene_unknown_scene(tmp_path: Path) -> None:
    root = make_dataset(
        tmp_path, {"scene_tool.txt": "s1 t1\ns2 t2\n", "query_scene_train.txt": "q1 s1\nq2 s9\n"}
    )
    ds, _ = assert_one_reject(root, "query_scene_train.txt", 2, "unknown scene-id 's9'")
    assert_good_rows(ds)
    assert ds.query_scene == {"train": {"q1": "s1"}}


def test_a_second_scene_for_a_query_is_rejected_and_the_first_kept(tmp_path: Path) -> None:
    root = make_dataset(
        tmp_path, {"scene_tool.txt": "s1 t1\ns2 t2\n", "query_scene_train.txt": "q1 s1\nq2 s2\nq1 s2\n"}
    )
    ds, _ = assert_one_reject(root, "query_scene_train.txt", 3, "query-id 'q1' already has scene 's1'")
    assert ds.query_scene == {"train": {"q1": "s1", "q2": "s2"}}


def test_query_scenes_without_scene_tool_are_rejected_line_by_line_not_ignored(tmp_path: Path) -> None:
    # They were skipped with no reject and no note: scenes (and a malformed line) vanished.
    root = make_dataset(tmp_path, {"query_scene_train.txt": "q1 s1\nq2 s2\n"})
    log = RejectLog()
    ds = load_dataset(root, log=log)
    assert [(r.file, r.line) for r in log.rejects] == [
        ("query_scene_train.txt", 1),
        ("query_scene_train.txt", 2),
    ]
    assert all("scene_tool.txt is missing" in r.reason for r in log.rejects)
    assert_good_rows(ds)
    assert ds.query_scene == {}
    root = make_dataset(tmp_path / "bad", {"query_scene_train.txt": "q1 s1\ngarbage line here\n"})
    log = RejectLog()
    load_dataset(root, log=log)
    assert sorted((r.line, r.reason) for r in log.rejects) == [
        (1, "scene-id 's1' names no tools: scene_tool.txt is missing"),
        (2, "expected 2 whitespace-separated ids, got 3 column(s)"),
    ]


def test_query_scene_query_not_in_split(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"scene_tool.txt": "s1 t1\n", "query_scene_train.txt": "q1 s1\nq3 s1\n"})
    ds, _ = assert_one_reject(root, "query_scene_train.txt", 2, "unknown query-id 'q3'")
    assert ds.query_scene == {"train": {"q1": "s1"}}


def test_scene_line_wrong_column_count(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"scene_tool.txt": "s1 t1\ns2 t2 t3\n"})
    ds, _ = assert_one_reject(root, "scene_tool.txt", 2, "expected 2 whitespace-separated ids, got 3")
    assert ds.scene_tool == {"s1": ["t1"]}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("42", "expected a JSON string"),
        ('["a query"]', "expected a JSON string"),
        ('{"query": "x"}', "expected a JSON string"),
        ("plain text", "malformed JSON"),
        ('"   "', "empty query"),
    ],
)
def test_neg_query_not_a_json_string(tmp_path: Path, bad: str, reason: str) -> None:
    neg = f'"what time is it"\n{bad}\n{{"text": "tell me a joke"}}\n'
    root = make_dataset(tmp_path, {"tooldet/neg_queries.jsonl": neg})
    ds, _ = assert_one_reject(root, "tooldet/neg_queries.jsonl", 2, reason)
    assert_good_rows(ds)
    assert ds.neg_queries == ["what time is it", "tell me a joke"]


def test_a_no_tool_query_asking_what_a_tool_query_asks_is_rejected(tmp_path: Path) -> None:
    # Kept, one request would be labelled both "needs a tool" and "needs none" for the detector.
    neg = '"what time is it"\n"First  Query!"\n"tell me a joke"\n'
    root = make_dataset(tmp_path, {"tooldet/neg_queries.jsonl": neg})
    ds, log = assert_one_reject(
        root, "tooldet/neg_queries.jsonl", 2, "the same request as query-id 'q1' in queries.jsonl"
    )
    assert log.rejects[0].content == '"First  Query!"'
    assert_good_rows(ds)
    assert ds.neg_queries == ["what time is it", "tell me a joke"]


def test_repeated_neg_query_is_kept_once_and_counted(tmp_path: Path) -> None:
    neg = '"tell me a joke"\n"what time is it"\n"tell me a joke"\n"tell me a joke"\n'
    log = RejectLog()
    ds = load_dataset(make_dataset(tmp_path, {"tooldet/neg_queries.jsonl": neg}), log=log, strict=True)
    assert ds.neg_queries == ["tell me a joke", "what time is it"]
    assert len(log) == 0  # a repeat is not a bad row: strict mode passes, the count is noted
    assert log.notes == {"tooldet/neg_queries.jsonl: dropped repeated texts (first kept)": 2}


# --- strict mode and the reject file ---------------------------------------------------------------


def test_strict_mode_lists_every_reject(tmp_path: Path) -> None:
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + "oops\n", "qrels/test.tsv": TEST + "q3\tt9\t1\n"})
    with pytest.raises(StrictModeError) as info:
        load_dataset(root, strict=True)
    message = str(info.value)
    assert "2 row(s) rejected" in message
    assert "corpus.jsonl:4: malformed JSON" in message
    assert "qrels/test.tsv:3: unknown corpus-id 't9'" in message


def test_reject_log_write_jsonl(tmp_path: Path) -> None:
    root = make_dataset(
        tmp_path / "data",
        {
            "corpus.jsonl": CORPUS + '{"_id": "t4", "text": 7}\n',
            "qrels/train.tsv": TRAIN + "q1\tt2\tx\n",
        },
    )
    log = RejectLog()
    load_dataset(root, log=log)
    out = tmp_path / "out" / "rejects.jsonl"
    log.write(str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [
        {
            "file": "corpus.jsonl",
            "line": 4,
            "reason": "'text' must be a string, got int",
            "content": '{"_id": "t4", "text": 7}',
        },
        {
            "file": "qrels/train.tsv",
            "line": 4,
            "reason": "score must be an integer, got 'x'",
            "content": "q1\tt2\tx",
        },
    ]
    assert log.counts() == {"corpus.jsonl": 1, "qrels/train.tsv": 1}


def test_reject_log_write_sorts_and_keeps_unicode(tmp_path: Path) -> None:
    log = RejectLog()
    log.add("b.tsv", 3, "late")
    log.add("a.jsonl", 9, "second", "ünïcode")
    log.add("a.jsonl", 2, "first", "x" * 2005)
    out = tmp_path / "rejects.jsonl"
    log.write(str(out))
    text = out.read_text(encoding="utf-8")
    assert "ünïcode" in text
    rows = [json.loads(line) for line in text.splitlines()]
    assert [(r["file"], r["line"]) for r in rows] == [("a.jsonl", 2), ("a.jsonl", 9), ("b.tsv", 3)]
    assert rows[0]["content"] == "x" * 2000 + "...[5 more chars]"
    assert set(rows[2]) == {"file", "line", "reason", "content"}


def test_reject_log_write_empty(tmp_path: Path) -> None:
    out = tmp_path / "rejects.jsonl"
    RejectLog().write(str(out))
    assert out.read_bytes() == b""


def test_a_long_bad_row_says_how_much_of_it_the_reject_leaves_out(tmp_path: Path) -> None:
    long = '{"_id": "t9", "text": ' + '"' + "w" * 3000 + '"'  # no closing brace: malformed
    root = make_dataset(tmp_path, {"corpus.jsonl": CORPUS + long + "\n"})
    log = RejectLog()
    load_dataset(root, log=log)
    (reject,) = [r for r in log.sorted() if r.file.endswith("corpus.jsonl")]
    assert reject.content.endswith("more chars]") and len(reject.content) < len(long)


def test_a_prepared_directory_takes_data_splits_given_as_one_name() -> None:
    # discover took one name as that split; the check of a prepared directory still split it into
    # characters (qrels/t.tsv, qrels/e.tsv, ...) and refused the very run the name asked for.
    from components.data import check_prepared_files

    manifest = {"inputs": {"qrels/test.tsv": {}, "corpus.jsonl": {}}}
    check_prepared_files("p", manifest, "test")
    check_prepared_files("p", manifest, ["test", "test"])
    with pytest.raises(DatasetError, match=r"asks for \['qrels/train.tsv'\]"):
        check_prepared_files("p", manifest, "train")
