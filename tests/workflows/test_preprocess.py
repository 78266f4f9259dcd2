"""The Ray Data preprocessing job equals the single-process loader and scipy graph builds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import write_tiny_dataset

from components.data import DatasetError, open_dataset
from components.data.graphs import IdMap, cooccurrence, incidence, load_sparse, qrels_pairs
from components.data.loader import load_dataset
from components.data.prepared import load_prepared, read_manifest
from components.data.rejects import RejectLog, StrictModeError
from components.data.splits import prepare_splits
from workflows.preprocess import preprocess


def run_job(data, out, **extra):
    cfg = {"data": {"path": str(data), **extra}, "preprocess": {"output": str(out), "parallelism": 3}}
    return preprocess(cfg)


def test_prepared_dataset_equals_single_process_load(ray_session, tmp_path):
    data = write_tiny_dataset(tmp_path / "d", bad_rows=True)
    manifest = run_job(data, tmp_path / "out")
    log = RejectLog()
    expected = prepare_splits(load_dataset(str(data), log=log))
    got = load_prepared(str(tmp_path / "out"))
    assert got.corpus == expected.corpus
    assert got.queries == expected.queries
    assert got.qrels == expected.qrels
    # In the same order too: training batches are drawn in dataset order, under a fixed seed.
    assert list(got.queries) == list(expected.queries)
    assert {s: list(q) for s, q in got.qrels.items()} == {s: list(q) for s, q in expected.qrels.items()}
    assert got.scene_tool == expected.scene_tool
    assert got.query_scene == expected.query_scene
    assert got.neg_queries == expected.neg_queries
    assert got.neg_split == expected.neg_split
    # The same rows are rejected, with the same file, line and reason, and written to rejects.jsonl.
    written = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["file"], r["line"], r["reason"]) for r in written] == [
        (r.file, r.line, r.reason) for r in log.sorted()
    ]
    assert manifest["rejects"]["total"] == len(log) == 5
    assert manifest["inputs"]["corpus.jsonl"]["bytes"] == (data / "corpus.jsonl").stat().st_size
    # Read back under the splits it was written with (defaults spelt out or not); other splits
    # settings are refused, not silently replaced by the prepared ones.
    assert open_dataset(str(tmp_path / "out"), {"seed": 0, "mode": "standard"}).qrels == got.qrels
    with pytest.raises(DatasetError, match="prepared with splits"):
        open_dataset(str(tmp_path / "out"), {"mode": "cold_start"})
    # So are other qrels files (data.splits): they decide the training set too.
    read = sorted(p.stem for p in (data / "qrels").glob("*.tsv"))
    assert open_dataset(str(tmp_path / "out"), files=read).qrels == got.qrels
    with pytest.raises(DatasetError, match=r"prepared from .* but this run asks for"):
        open_dataset(str(tmp_path / "out"), files=read[:1])
    # data.strict refuses the preparation of data with rejects, as it refuses the raw data.
    with pytest.raises(DatasetError, match=r"data.strict is set, and preparing it rejected 5 row"):
        open_dataset(str(tmp_path / "out"), strict=True)


def test_graphs_equal_scipy_builds(ray_session, tmp_path):
    data = write_tiny_dataset(tmp_path / "d")
    run_job(data, tmp_path / "out")
    ds = prepare_splits(load_dataset(str(data)))
    tools, train = IdMap.of(ds.corpus), ds.qrels["train"]
    queries = IdMap.of(train)
    q, t = qrels_pairs(train, queries, tools)
    cooc, rows, cols = load_sparse(str(tmp_path / "out" / "graphs" / "cooccurrence"))
    assert rows == cols == tools
    np.testing.assert_array_equal(cooc.toarray(), cooccurrence(q, t, len(tools)).toarray())
    qt, qrows, _ = load_sparse(str(tmp_path / "out" / "graphs" / "query_tool"))
    assert qrows == queries
    np.testing.assert_array_equal(qt.toarray(), incidence(q, t, (len(queries), len(tools))).toarray())
    st, srows, _ = load_sparse(str(tmp_path / "out" / "graphs" / "scene_tool"))
    # Only the scenes of training queries: a test query's scene is the answer to it.
    train_scenes = set(ds.query_scene["train"].values())
    assert set(srows.ids) == train_scenes != set(ds.scene_tool)
    si = srows.index()
    pairs = np.array([(si[s], tools.index()[x]) for s in train_scenes for x in ds.scene_tool[s]])
    np.testing.assert_array_equal(st.toarray(), incidence(pairs[:, 0], pairs[:, 1], st.shape).toarray())
    qs, _, scols = load_sparse(str(tmp_path / "out" / "graphs" / "query_scene"))
    assert qs.sum() == len(ds.query_scene["train"]) and scols == srows


def test_strict_mode_fails_with_file_and_line(ray_session, tmp_path):
    data = write_tiny_dataset(tmp_path / "d", bad_rows=True)
    run_job(write_tiny_dataset(tmp_path / "good"), tmp_path / "out")  # an earlier, finished output
    with pytest.raises(StrictModeError, match=r"corpus.jsonl:5: malformed JSON(.|\n)*every reject: "):
        run_job(data, tmp_path / "out", strict=True)
    # The failed run leaves no manifest, so the old tables beside it are not taken for its output.
    assert not (tmp_path / "out" / "manifest.json").exists()
    # The whole reject file is written before the job fails, not only the lines the message shows.
    assert len((tmp_path / "out" / "rejects.jsonl").read_text().splitlines()) == 5
    # An output on top of the input would overwrite the raw qrels it reads: refused, nothing changed.
    before = (data / "qrels" / "train.tsv").read_bytes()
    with pytest.raises(ValueError, match="is the input dataset"):
        run_job(data, tmp_path / "d" / ".")
    with pytest.raises(ValueError, match="is the input dataset"):  # the same place as a file:// URL
        run_job(data, f"file://{data}")
    assert (data / "qrels" / "train.tsv").read_bytes() == before
    # Nor another raw dataset, whose qrels/ the prepared tables would replace.
    other = write_tiny_dataset(tmp_path / "other")
    kept = (other / "qrels" / "train.tsv").read_bytes()
    with pytest.raises(ValueError, match="holds a raw dataset"):
        run_job(data, other)
    assert (other / "qrels" / "train.tsv").read_bytes() == kept


def test_rerun_into_the_same_output_leaves_nothing_stale(ray_session, tmp_path):
    data = write_tiny_dataset(tmp_path / "d")
    out = tmp_path / "out"
    run_job(data, out)
    assert load_prepared(str(out)).neg_queries and (out / "graphs" / "scene_tool.npz").exists()
    for name in ("tooldet/neg_queries.jsonl", "scene_tool.txt", "query_scene_train.txt"):
        (data / name).unlink()
    (data / "query_scene_test.txt").unlink()
    manifest = run_job(data, out)
    got = load_prepared(str(out))
    assert got.neg_queries == [] and got.scene_tool == {} and got.query_scene == {}
    assert manifest["outputs"]["neg_queries"]["rows"] == 0
    assert not (out / "graphs" / "scene_tool.npz").exists() and (out / "graphs" / "query_tool.npz").exists()


def test_a_prepared_dir_missing_part_of_a_table_is_refused(ray_session, tmp_path):
    # A copy stopped part-way (the manifest there, a table not whole) loaded as a dataset with
    # partial splits, and trained and evaluated on them without a word.
    data = write_tiny_dataset(tmp_path / "d")
    out = tmp_path / "out"
    run_job(data, out)
    load_prepared(str(out))
    for f in sorted((out / "qrels").rglob("*.parquet"))[:1]:
        f.unlink()
    with pytest.raises(
        ValueError,
        match=r"qrels: \d+ rows where its manifest records \d+; the prepared directory is incomplete",
    ):
        load_prepared(str(out))


def test_a_prepared_dir_missing_a_graph_is_refused(ray_session, tmp_path):
    # A copy without graphs/query_scene.* loaded, and MassTool trained without scenes, silently.
    data = write_tiny_dataset(tmp_path / "d")
    out = tmp_path / "out"
    run_job(data, out)
    assert set(load_prepared(str(out)).graphs) == {"cooccurrence", "query_scene", "query_tool", "scene_tool"}
    for f in (out / "graphs").glob("query_scene.*"):
        f.unlink()
    with pytest.raises(
        ValueError, match=r"query_scene\.npz is missing where its manifest records \(\d+, \d+\)"
    ):
        load_prepared(str(out))


def test_tool_metadata_of_any_shape_survives(ray_session, tmp_path):
    data = write_tiny_dataset(tmp_path / "d")
    lines = (data / "corpus.jsonl").read_text().splitlines()
    # The last in its own key order (an MCP tool's parameters are listed as the server wrote
    # them; sorted, a selector prompt built from a prepared dir listed them otherwise).
    metadata = [{"a": 1}, {"a": "x", "tags": ["b"]}, {}, {"nested": {"z": None, "k": 2}}]
    rows = [{**json.loads(line), "metadata": m} for line, m in zip(lines, metadata, strict=True)]
    (data / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_job(data, tmp_path / "out")
    got = load_prepared(str(tmp_path / "out"))
    assert [got.corpus[r["_id"]]["metadata"] for r in rows] == metadata
    assert json.dumps([got.corpus[r["_id"]]["metadata"] for r in rows]) == json.dumps(metadata)


def test_manifest_hashes_are_stable(ray_session, tmp_path):
    data = write_tiny_dataset(tmp_path / "d")
    run_job(data, tmp_path / "a")
    run_job(data, tmp_path / "b")
    a, b = read_manifest(str(tmp_path / "a")), read_manifest(str(tmp_path / "b"))
    assert a["outputs"] == b["outputs"] and a["inputs"] == b["inputs"]
    assert a["counts"]["train_queries"] + a["counts"]["valid_queries"] == 5
    # Stable, and about the data: one tool's text changed changes its input's and output's hash.
    corpus = data / "corpus.jsonl"
    corpus.write_text(corpus.read_text().replace("Weather forecast", "Climate forecast", 1))
    run_job(data, tmp_path / "c")
    c = read_manifest(str(tmp_path / "c"))
    changed = lambda x, y: {k for k in x if x[k] != y[k]}  # noqa: E731
    assert changed(a["inputs"], c["inputs"]) == {"corpus.jsonl"} and "corpus" in changed(
        a["outputs"], c["outputs"]
    )


def test_toollens_ingest_matches_loader(ray_session, toollens, tmp_path):
    manifest = run_job(toollens, tmp_path / "out")
    expected = prepare_splits(load_dataset(str(toollens)))
    got = load_prepared(str(tmp_path / "out"))
    assert got.qrels == expected.qrels and got.corpus == expected.corpus
    assert manifest["counts"]["tools"] == 464
    assert manifest["counts"]["test_queries"] == 1877
    assert manifest["rejects"]["total"] == 0
    assert manifest["notes"]["qrels/test.tsv: merged duplicate pairs"] == 23
    assert manifest["notes"]["tooldet/neg_queries.jsonl: dropped repeated texts (first kept)"] == 126
    assert got.neg_split == expected.neg_split and len(got.neg_queries) == 2997


# One block in order (the shuffle-free path: cut into one block per CPU, so a basket can straddle
# two blocks), then the pairs of each basket shuffled over 16 blocks (the hash-partitioned path). Each
# shuffled case costs ~5 s of Ray Data shuffle actors on 2 cores, so there is one.
@pytest.mark.parametrize(("blocks", "shuffled"), [(1, False), (16, True)])
def test_ray_cooccurrence_exact_for_any_blocking(ray_session, blocks, shuffled):
    from workflows.ray_graphs import pairs_dataset, ray_cooccurrence

    rng = np.random.default_rng(blocks)
    basket = np.repeat(np.arange(400), rng.integers(1, 5, 400))
    tool = rng.integers(0, 30, len(basket))
    order = rng.permutation(len(basket)) if shuffled else np.arange(len(basket))
    built = ray_cooccurrence(pairs_dataset(basket[order], tool[order], blocks), 30, num_partitions=3)
    np.testing.assert_array_equal(built.toarray(), cooccurrence(basket, tool, 30).toarray())


def test_ray_cooccurrence_of_no_pairs_is_zero_as_in_process(ray_session):
    from workflows.ray_graphs import pairs_dataset, ray_cooccurrence

    none = np.array([], np.int64)
    built = ray_cooccurrence(pairs_dataset(none, none, 3), 5)
    assert built.shape == (5, 5) and built.nnz == 0
    np.testing.assert_array_equal(built.toarray(), cooccurrence(none, none, 5).toarray())


def test_masstool_trains_on_the_graphs_preprocess_built(ray_session, tmp_path):
    from dataclasses import replace

    from components.data.graphs import training_graphs
    from components.methods.masstool.graph import build_graphs

    data = write_tiny_dataset(tmp_path / "d")
    run_job(data, tmp_path / "out")
    prepared = load_prepared(str(tmp_path / "out"))
    raw = prepare_splits(load_dataset(str(data)))
    # A prepared dataset carries Ray Data's graphs; a raw one has none and builds them in-process
    # from the same inputs with the same kernels: equal matrices.
    assert set(prepared.graphs) == {"cooccurrence", "query_tool", "scene_tool", "query_scene"}
    assert raw.graphs == {}
    built = training_graphs(raw)
    for name, graph in prepared.graphs.items():
        assert graph.rows == built[name].rows and graph.cols == built[name].cols, name
        np.testing.assert_array_equal(graph.matrix.toarray(), built[name].matrix.toarray())
    a, b = build_graphs(prepared), build_graphs(raw)
    assert (a.query_ids, a.tool_ids, a.scene_ids) == (b.query_ids, b.tool_ids, b.scene_ids)
    for field in ("query_tool", "query_scene", "scene_tool"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    # What MassTool reads is the prepared artifact: a graph that disagrees with the dataset's
    # training split (e.g. qrels edited after loading) is an error, not a silent rebuild.
    fewer = dict(prepared.qrels["train"])
    fewer.pop(next(iter(fewer)))
    with pytest.raises(ValueError, match="re-run preprocessing"):
        build_graphs(replace(prepared, qrels={**prepared.qrels, "train": fewer}))
    # The same queries and tools, but one query's tool changed: the edges differ.
    moved = dict(prepared.qrels["train"])
    query, rel = next(iter(moved.items()))
    other = next(t for t in prepared.corpus if t not in rel)
    moved[query] = {**{t: s for t, s in list(rel.items())[1:]}, other: 1}
    with pytest.raises(ValueError, match="edges are not the"):
        build_graphs(replace(prepared, qrels={**prepared.qrels, "train": moved}))
    # The same check guards every reader of the prepared graphs: ToolWeaver's co-occurrence too.
    from components.methods.toolweaver.method import catalog_cooccurrence

    stale = replace(prepared, qrels={**prepared.qrels, "train": moved})
    with pytest.raises(ValueError, match="edges are not the"):
        catalog_cooccurrence(stale, list(prepared.corpus), "none")
    assert catalog_cooccurrence(prepared, list(prepared.corpus), "none").shape == (len(prepared.corpus),) * 2
    # A prepared directory missing its query_tool graph: said, not a bare KeyError (and the
    # co-occurrence, with nothing to check it against, is not used unchecked).
    partial = replace(prepared, graphs={k: v for k, v in prepared.graphs.items() if k != "query_tool"})
    with pytest.raises(ValueError, match=r"no graphs/query_tool.npz .*re-run toolscout preprocess"):
        build_graphs(partial)


def test_a_bom_and_crlf_line_ends_read_as_the_loader_reads_them_and_an_empty_corpus_is_refused(
    ray_session, tmp_path
):
    data = write_tiny_dataset(tmp_path / "d")
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
        path = data / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))  # as Windows saves
    run_job(data, tmp_path / "out", strict=True)  # not one row rejected
    expected = prepare_splits(load_dataset(str(data), strict=True))
    got = load_prepared(str(tmp_path / "out"))
    assert got.corpus == expected.corpus and got.queries == expected.queries and got.qrels == expected.qrels
    (data / "corpus.jsonl").write_bytes(b"\xef\xbb\xbf\r\n")
    with pytest.raises(DatasetError, match=r"corpus\.jsonl: file is empty"):
        run_job(data, tmp_path / "out2")
