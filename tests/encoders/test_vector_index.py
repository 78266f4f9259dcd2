"""The tool-vector index: exact search is the matmul's top-k, HNSW finds the same neighbours at
high recall, auto switches at the configured catalog size, and bad settings fail clearly."""

from __future__ import annotations

import pytest
import torch

from components.encoders.vector_index import IndexSettings, VectorIndex

faiss = pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'toolscout[faiss]')")


def clustered(n: int, dim: int = 32, centers: int = 50, seed: int = 0) -> torch.Tensor:
    """Unit vectors around a few centres, as tool embeddings cluster by domain."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(centers, dim, generator=g)
    x = c[torch.randint(0, centers, (n,), generator=g)] + 0.4 * torch.randn(n, dim, generator=g)
    return torch.nn.functional.normalize(x, dim=1)


def test_exact_is_the_matmul_top_k():
    tools, queries = clustered(500), clustered(20, seed=1)
    scores, positions = VectorIndex(tools, IndexSettings(kind="exact")).search(queries, 5)
    want_scores, want_positions = (queries @ tools.T).topk(5, dim=1)
    assert torch.equal(positions, want_positions) and torch.equal(scores, want_scores)


def test_tied_tools_come_in_catalog_order_on_every_index_kind():
    """Tools with the same vector (duplicate descriptions) tie exactly: every kind lists them in
    catalog order, and a cut through the tie keeps the first ones."""
    g = torch.Generator().manual_seed(3)
    tools = torch.nn.functional.normalize(torch.randn(300, 16, generator=g), dim=1)
    shuffled = torch.randperm(300, generator=g)
    twins = shuffled[:6].sort().values  # six copies of one vector, spread over the catalog
    tools[twins] = tools[twins[0]].clone()
    queries = torch.cat([tools[twins[:1]], near(tools, 30, seed=4)])
    for k in (3, 6, 8):
        want = None
        for kind in ("exact", "faiss"):
            scores, positions = VectorIndex(tools, IndexSettings(kind=kind)).search(queries, k)
            assert positions[0, : min(k, 6)].tolist() == twins[: min(k, 6)].tolist(), (kind, k)
            assert (scores[:, :-1] >= scores[:, 1:]).all()
            want = positions[:1] if want is None else want
            assert torch.equal(positions[:1], want)


def test_duplicate_tools_tie_exactly_alone_or_batched():
    # A matrix product rounds identical columns apart (~1e-8, by their position and the batch
    # size): a query near a duplicated tool got the later copy first for about a third of queries,
    # and another copy alone than in its serving batch.
    g = torch.Generator().manual_seed(0)
    tools = torch.nn.functional.normalize(torch.randn(1001, 384, generator=g), dim=1)
    tools[500] = tools[1000] = tools[0]
    index = VectorIndex(tools, IndexSettings(kind="exact"))
    queries = near(tools[:1].expand(200, -1).contiguous(), 200, seed=5)
    queries = torch.nn.functional.normalize(tools[0] + 0.01 * (queries - tools[0]), dim=1)
    scores, batched = index.search(queries, 3)
    assert batched.tolist() == [[0, 500, 1000]] * 200 and (scores[:, 0] == scores[:, 2]).all()
    assert all(index.search(queries[i : i + 1], 1)[1].item() == 0 for i in range(0, 200, 7))


def near(tools: torch.Tensor, n: int, seed: int = 1) -> torch.Tensor:
    """Queries that are tool vectors moved by noise (a request worded like some tool)."""
    g = torch.Generator().manual_seed(seed)
    picked = tools[torch.randint(0, len(tools), (n,), generator=g)]
    return torch.nn.functional.normalize(picked + 0.2 * torch.randn(picked.shape, generator=g), dim=1)


def test_hnsw_and_flat_faiss_agree_with_exact_search():
    tools = clustered(4000)
    queries = near(tools, 200)
    _, exact = VectorIndex(tools, IndexSettings(kind="exact")).search(queries, 10)
    _, flat = VectorIndex(tools, IndexSettings(kind="faiss")).search(queries, 10)
    hnsw = VectorIndex(tools, IndexSettings(kind="hnsw"))  # the defaults
    _, approx = hnsw.search(queries, 10)
    same = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(exact, flat, strict=True)]
    assert sum(same) / (10 * len(queries)) > 0.999  # float ties may order differently
    recall = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(exact, approx, strict=True))
    assert recall / (10 * len(queries)) >= 0.98
    # A tiny ef_search gives up recall: the setting reaches the graph search.
    low = VectorIndex(tools, IndexSettings(kind="hnsw", m=4, ef_construction=8, ef_search=1))
    _, worse = low.search(queries, 10)
    lost = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(exact, worse, strict=True))
    assert lost < recall
    assert hnsw.memory_bytes() > tools.numel() * 4  # the vectors plus the graph


def test_auto_builds_hnsw_from_the_configured_size_and_bad_settings_fail():
    settings = IndexSettings(kind="auto", exact_below=1000)
    assert VectorIndex(clustered(999), settings).kind == "exact"
    assert VectorIndex(clustered(1000), settings).kind == "hnsw"
    with pytest.raises(ValueError, match="index kind"):
        IndexSettings(kind="annoy")
    with pytest.raises(ValueError, match="ef_search must be >= 1"):
        IndexSettings(ef_search=0)


def test_dense_builds_its_hnsw_index_at_index_time(small_quickstart, tmp_path):
    """An untrained encoder is enough: the index must find what exact search finds."""
    from conftest import TINY_ENCODER

    from components.encoders.bi_encoder import BiEncoder
    from components.methods.dense.method import DenseMethod

    exact = DenseMethod(encoder=TINY_ENCODER, id_head=False, index_backend="exact")
    exact.initial_model(small_quickstart, str(tmp_path / "init"), seed=0)
    exact.model = BiEncoder.load(str(tmp_path / "init"))
    exact.index(small_quickstart.corpus)
    approx = DenseMethod(encoder=TINY_ENCODER, id_head=False, index_backend="auto", index_exact_below=10)
    approx.model = exact.model
    approx.index(small_quickstart.corpus)
    assert approx._search is not None and approx._search.kind == "hnsw"  # built before any query
    queries = small_quickstart.split_queries("test")
    a, b = exact.retrieve(queries, 5), approx.retrieve(queries, 5)
    overlap = sum(len(set(a[q]) & set(b[q])) for q in queries) / (5 * len(queries))
    assert overlap >= 0.95


def test_faiss_on_an_empty_catalogue_has_no_hits_as_exact_search():
    pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'toolscout[faiss]')")
    queries = torch.randn(2, 8)
    for kind in ("exact", "faiss", "hnsw"):
        scores, positions = VectorIndex(torch.empty(0, 8), IndexSettings(kind=kind)).search(queries, 5)
        assert scores.shape == positions.shape == (2, 0)
