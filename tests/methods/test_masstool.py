"""MassTool: graphs, module invariants, loss, ablation switches, trained beats untrained."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import TINY_ENCODER
from torch_geometric.utils import to_dense_adj

from components.encoders import EncoderSpec, TextEncoder
from components.methods import load
from components.methods.masstool.graph import build_graphs
from components.methods.masstool.layers import SUIM, AdaKT, ModelConfig
from components.methods.masstool.method import JOINT_TASK, MassToolMethod
from components.methods.masstool.model import MassToolModel
from components.methods.masstool.params import MassToolParams
from components.methods.masstool.task import MassToolTask, retrieval_loss
from components.metrics import auroc, evaluate_retrieval
from components.training.spec import RunSpec, StageConfig, StageInputs


@pytest.fixture(scope="module")
def graphs(small_quickstart):
    return build_graphs(small_quickstart)


def tiny_model(data, graphs, **cfg) -> MassToolModel:
    texts = list(data.queries.values())
    encoder = TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), texts)
    model = MassToolModel(encoder, graphs, ModelConfig(dim=16, detection_hidden=8, **cfg))
    model.refresh([data.queries[q] for q in graphs.query_ids], [c["text"] for c in data.corpus.values()], 32)
    return model


def test_graphs_hold_training_pairs_only(small_quickstart, graphs):
    train = small_quickstart.qrels["train"]
    assert graphs.query_ids == list(train)
    pairs = {(graphs.query_ids[q], graphs.tool_ids[t]) for q, t in graphs.query_tool.T}
    assert pairs == {(q, t) for q, rel in train.items() for t, s in rel.items() if s > 0}
    assert not set(small_quickstart.qrels["test"]) & set(graphs.query_ids)
    scenes = small_quickstart.query_scene["train"]
    assert {(graphs.query_ids[q], graphs.scene_ids[s]) for q, s in graphs.query_scene.T} == {
        (q, scenes[q]) for q in graphs.query_ids if q in scenes
    }
    m = graphs.scene_tool_matrix()
    has = m.sum(1) > 0
    torch.testing.assert_close(m[has].sum(1), torch.ones(int(has.sum())))


def test_graph_save_load_roundtrip(graphs, tmp_path):
    graphs.save(str(tmp_path))
    back = type(graphs).load(str(tmp_path))
    assert back.query_ids == graphs.query_ids and back.scene_ids == graphs.scene_ids
    np.testing.assert_array_equal(back.query_tool, graphs.query_tool)


def test_lightgcn_readout_is_the_mean_of_normalised_propagations(small_quickstart, graphs):
    model = tiny_model(small_quickstart, graphs, layers=2, edge_dropout=0.0).eval()
    gcn = model.gcn
    x = torch.randn(graphs.n_queries + graphs.n_tools, 16)
    a = to_dense_adj(gcn.tool_edges, max_num_nodes=x.shape[0])[0]
    d = a.sum(1).pow(-0.5).nan_to_num(0.0, posinf=0.0)
    norm = d[:, None] * a * d[None, :]
    expected = (x + norm @ x + norm @ norm @ x) / 3
    torch.testing.assert_close(gcn.propagate(x, gcn.tool_edges), expected, atol=1e-5, rtol=1e-4)


def test_shapes_and_cross_view_loss(small_quickstart, graphs):
    model = tiny_model(small_quickstart, graphs).train()
    q, t, cl = model.graph(torch.arange(8))
    assert q.shape == (graphs.n_queries, 16) and t.shape == (graphs.n_tools, 16)
    assert cl is not None and cl.ndim == 0 and cl.item() > 0
    model.eval()
    assert model.graph(torch.arange(8))[2] is None  # no augmentation, no CL at inference


def test_cross_view_loss_without_pairs_is_a_zero_that_keeps_scene_embeddings_in_the_graph(
    small_quickstart, graphs
):
    model = tiny_model(small_quickstart, graphs).train()
    cl = model.graph(torch.arange(1))[2]  # one query: nothing to contrast
    assert cl is not None and cl.item() == 0.0
    cl.backward()
    assert model.gcn.scene_emb.weight.grad is not None  # DDP sees the parameter used


def test_no_scene_view_without_the_graph(small_quickstart, graphs):
    model = tiny_model(small_quickstart, graphs, graph=False)
    assert not model.gcn.scene_view and not hasattr(model.gcn, "scene_emb")


def test_suim_filters_neighbours_below_epsilon():
    cfg = ModelConfig(dim=4, epsilon=0.5)
    suim = SUIM(4, cfg)
    query = torch.randn(2, 4)
    neighbours = torch.randn(2, 3, 4)
    sims = torch.tensor([[0.9, 0.4, 0.6], [0.1, 0.2, 0.3]])
    out, keep = suim(query, sims, neighbours)
    assert keep.tolist() == [[True, False, True], [False, False, False]]
    # Row 1 keeps nobody: its search embedding is the query itself.
    torch.testing.assert_close(out[1], query[1])
    # Row 0 does not depend on the filtered neighbour.
    moved = neighbours.clone()
    moved[0, 1] += 100.0
    torch.testing.assert_close(suim(query, sims, moved)[0][0], out[0])
    # Without dynamic filtering every neighbour counts.
    unfiltered = SUIM(4, ModelConfig(dim=4, epsilon=0.5, dynamic_filter=False))
    unfiltered.load_state_dict(suim.state_dict())
    assert not torch.allclose(unfiltered(query, sims, moved)[0][0], out[0])


def test_search_never_returns_the_query_itself(small_quickstart, graphs):
    model = tiny_model(small_quickstart, graphs, neighbours=3)
    own = torch.arange(5)
    _sims, index = model.search(model.pool[own], exclude=own)
    assert not (index == own[:, None]).any()
    top, _ = model.search(model.pool[own])
    torch.testing.assert_close(top[:, 0], torch.ones(5))  # otherwise it would be found (cosine 1)


def test_a_training_step_takes_no_neighbour_whose_edges_it_hides(small_quickstart, graphs):
    # Batch queries hidden this step are bare graph nodes (no tool in their readout); as each
    # other's neighbours SUIM trained on inputs it never meets at inference. Here the batch's own
    # rows are each other's nearest (cosine 1 with themselves, near with their paraphrases).
    model = tiny_model(small_quickstart, graphs, neighbours=8).train()
    batch = torch.arange(0, 64, 4)
    seen = []

    def recording(*args, _search=model.search):
        sims, index = _search(*args)
        seen.append(index)
        return sims, index

    model.search = recording
    tokens = model.encoder.tokenizer(["weather in paris"] * len(batch), return_tensors="pt", padding=True)
    model(tokens["input_ids"], tokens["attention_mask"], batch, semantic=model.pool[batch])
    assert seen and not set(seen[0].flatten().tolist()) & set(batch.tolist())
    # Outside training (no edges hidden) a query may have any training query as neighbour.
    _, index = model.search(model.pool[batch])
    assert set(index.flatten().tolist()) & set(batch.tolist())


@pytest.mark.parametrize("mode", ["gate", "attention", "concat", "add"])
def test_adakt_modes(mode):
    torch.manual_seed(0)
    adakt = AdaKT(hidden=6, dim=4, mode=mode)
    h, e = torch.randn(3, 6), torch.randn(3, 4)
    out = adakt(h, e)
    assert out.shape == (3, 4)
    if mode == "gate":
        torch.testing.assert_close(out, torch.sigmoid(adakt.proj(h)) * e)
    if mode == "add":
        torch.testing.assert_close(out, e + adakt.proj(h))
    if mode == "concat":
        torch.testing.assert_close(out, adakt.proj(torch.cat([h, e], dim=-1)))
    if mode == "attention":
        # A convex mix of the search embedding and the transferred knowledge, the weights scored per
        # candidate and normalised over the two (a softmax over the size-1 score axis gives 1 and 1).
        t = adakt.proj(h)
        scores = torch.cat([adakt.att_v(torch.tanh(adakt.att(x))) for x in (e, t)], dim=1)  # (3, 2)
        w = torch.softmax(scores, dim=1)
        torch.testing.assert_close(out, w[:, :1] * e + w[:, 1:] * t)
        assert not torch.allclose(out, e + t)


def test_unknown_adakt_mode_is_rejected():
    with pytest.raises(ValueError, match="adakt"):
        MassToolMethod(adakt="multiply")


def test_retrieval_loss_masks_other_relevant_tools():
    scores = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 0.3, 0.2, 0.1]])
    relevant = torch.tensor([[True, True, False, False], [False, False, False, False]])
    # Query 0: each relevant tool against the two negatives only; query 1 contributes nothing.
    neg = torch.tensor([0.5, -1.0])
    expected = (
        -torch.log_softmax(torch.cat([scores[0, :1], neg]), 0)[0]
        - torch.log_softmax(torch.cat([scores[0, 1:2], neg]), 0)[0]
    ) / 2
    torch.testing.assert_close(retrieval_loss(scores, relevant), expected)


def test_unseen_tool_is_embedded_from_its_text(small_quickstart, graphs):
    model = tiny_model(small_quickstart, graphs, layers=2).eval()
    text = torch.nn.functional.normalize(torch.randn(2, model.encoder.dim), dim=-1)
    vectors, query_graph = model.tool_index([graphs.tool_ids[0], "brand-new-tool"], text)
    assert query_graph.shape == (graphs.n_queries, vectors.shape[1])
    torch.testing.assert_close(vectors[1], model.gcn.tool_text(text[1]) / 3)


def test_tool_dropout_makes_a_trained_tool_look_unseen_in_a_training_step(small_quickstart, graphs):
    # A cold tool's training-step readout is what an unseen tool gets at inference (its text
    # projection over L+1), while the other tools keep their ID vectors and edges.
    model = tiny_model(small_quickstart, graphs, layers=2, edge_dropout=0.0, tool_dropout=0.5).train()
    x = model.query_proj(model.pool)
    torch.manual_seed(0)
    cold = model.gcn.cold_tools()
    torch.manual_seed(0)
    tools = model.gcn(x, model.tool_text)[1]
    trained = model.gcn.trained_tool.squeeze(-1) > 0
    assert 0 < int(cold.sum()) < int(trained.sum()) and not bool((cold & ~trained).any())
    text_only = model.gcn.tool_text(model.tool_text) / 3
    torch.testing.assert_close(tools[cold], text_only[cold])
    warm = trained & ~cold
    assert not torch.allclose(tools[warm], text_only[warm])
    # Evaluation and the default setting draw nothing: no tool is cold, the RNG is untouched.
    assert model.eval().gcn.cold_tools() is None
    assert tiny_model(small_quickstart, graphs).train().gcn.cold_tools() is None
    with pytest.raises(ValueError, match="tool_dropout"):
        ModelConfig(tool_dropout=1.0)


def joint_stage(params: MassToolParams, data, semantic_dir: str) -> StageConfig:
    """The joint stage as the runner hands it to a worker, for driving the task by hand."""
    return StageConfig.from_params(JOINT_TASK, "joint", params, StageInputs(data, semantic_dir))


def no_grad(module: torch.nn.Module) -> bool:
    """Whether the last backward pass left ``module`` no gradient."""
    return all(p.grad is None or not p.grad.abs().sum() for p in module.parameters())


def propagates_nothing(model) -> bool:
    queries, _, cl = model.graph()
    return cl is None and torch.equal(queries, model.query_proj(model.pool))


# Each ablation switch, and what it must change in the model that trained one step with it.
ABLATIONS = [
    ({"graph": False}, propagates_nothing),  # no QC-GCN layers: the layer-0 inputs come back
    ({"suim": False}, lambda model: model.suim is None),
    ({"adakt": "none"}, lambda model: model.adakt is None),
    ({"adakt": "attention"}, lambda model: model.adakt is not None and model.adakt.mode == "attention"),
    ({"dynamic_filter": False}, lambda model: not model.cfg.dynamic_filter and model.suim is not None),
    ({"contrastive_weight": 0.0}, lambda model: not model.gcn.scene_view),  # no second view built
    # With no detection loss and nothing that feeds the detector's hidden state into retrieval,
    # the detection tower learns nothing.
    ({"detection_weight": 0.0, "suim": False, "adakt": "none"}, lambda model: no_grad(model.detector)),
    ({"finetune_encoder": False}, lambda model: no_grad(model.encoder)),
    ({"tool_dropout": 0.5}, lambda model: bool(model.gcn.cold_tools().any())),
]


@pytest.mark.parametrize(("switches", "took_effect"), ABLATIONS, ids=[str(s) for s, _ in ABLATIONS])
def test_every_ablation_trains_one_step_and_changes_what_it_names(
    small_quickstart, tmp_path, switches, took_effect
):
    bi = tmp_path / "semantic"
    from components.encoders.bi_encoder import BiEncoder

    encoder = TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), list(small_quickstart.queries.values()))
    BiEncoder(encoder).save(str(bi))
    params = MassToolParams(dim=16, detection_hidden=8, **switches)

    task = MassToolTask(joint_stage(params, small_quickstart, str(bi)))
    model = task.build_model()
    task.start_epoch(model, 0)
    batch = task.collate(task.train_data()[:16] + task.train_data()[-4:])
    loss = task.loss(model.train(), batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with torch.no_grad():
        assert took_effect(model)


@pytest.fixture(scope="module")
def trained(trained_masstool):
    """The session's MassTool (tests/conftest.py), trained once through every stage."""
    return trained_masstool


def test_trained_model_beats_untrained(trained, with_negatives):
    method, reports, _root, _ = trained
    assert reports["joint"]["valid_ndcg@3"] > 0
    untrained = MassToolMethod.from_model(
        MassToolModel(
            TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), list(with_negatives.queries.values())),
            build_graphs(with_negatives),
            method.params.model_config(),
        ),
        method.params,
    )
    untrained.model.refresh(
        [with_negatives.queries[q] for q in untrained.model.graphs.query_ids],
        [c["text"] for c in with_negatives.corpus.values()],
        32,
    )
    untrained.index(with_negatives.corpus)
    queries = with_negatives.split_queries("test")
    before = evaluate_retrieval(with_negatives.qrels["test"], untrained.retrieve(queries, 10))
    after = evaluate_retrieval(with_negatives.qrels["test"], method.retrieve(queries, 10))
    assert after["ndcg@3"] > before["ndcg@3"] + 0.2
    assert after["recall@5"] > before["recall@5"] + 0.2


def test_detector_separates_tool_queries_from_chitchat(trained, with_negatives):
    method = trained[0]
    data = with_negatives
    # Every held-out query on both sides (valid + test), so the AUROC is not a 30-query coin toss.
    tool = method.detect({**data.split_queries("valid"), **data.split_queries("test")})
    held_out = data.neg_split["valid"] + data.neg_split["test"]
    chat = method.detect({str(i): t for i, t in enumerate(held_out)})
    labels = np.array([1] * len(tool) + [0] * len(chat))
    scores = np.array(list(tool.values()) + list(chat.values()))
    # An untrained tower scores both sides alike (AUROC ~0.5).
    assert auroc(labels, scores) > 0.7, (np.mean(list(tool.values())), np.mean(list(chat.values())))


def test_one_pass_over_many_queries_answers_each_as_alone(trained, with_negatives):
    # retrieve is retrieve_detected's first half, so comparing the two would compare one path with
    # itself: each query is compared with a call that holds it alone (padding, batch order).
    method = trained[0]
    queries = {**dict(list(with_negatives.split_queries("test").items())[:6]), "chat": "hi, how are you?"}
    found, detected = method.retrieve_detected(queries, 5)
    for q, text in queries.items():
        alone, p = method.retrieve_detected({q: text}, 5)
        assert list(found[q]) == list(alone[q]), q
        assert list(found[q].values()) == pytest.approx(list(alone[q].values()), abs=1e-5)
        assert (
            detected[q]
            == pytest.approx(p[q], abs=1e-6)
            == pytest.approx(method.detect({q: text})[q], abs=1e-6)
        )
    assert method.retrieve_detected({}, 5) == ({}, {})


def test_new_query_and_new_tool_after_training(trained, with_negatives):
    method = trained[0]
    out = method.retrieve({"new": "a query nobody wrote before, about the weather"}, 5)
    assert len(out["new"]) == 5 and all(t in with_negatives.corpus for t in out["new"])
    entries = list(with_negatives.corpus.values())
    corpus = {**with_negatives.corpus, "added": {**entries[0], "_id": "added"}}
    method.index(corpus)
    try:
        n = len(corpus)
        own = method.retrieve({"q": entries[0]["text"]}, n)["q"]
        others = method.retrieve({str(i): e["text"] for i, e in enumerate(entries[1:21])}, n)
        # The new tool is indexed from its text alone and is scored like any other tool; its own
        # text scores it higher than most other tools' texts do.
        assert np.isfinite(own["added"])
        assert own["added"] > np.median([r["added"] for r in others.values()])
    finally:
        method.index(with_negatives.corpus)


def test_save_load_roundtrip_and_registry(trained, with_negatives, tmp_path):
    method = trained[0]
    method.save(str(tmp_path / "art"))
    back = load(str(tmp_path / "art"))
    queries = with_negatives.split_queries("valid")
    got, want = back.retrieve(queries, 5), method.retrieve(queries, 5)
    for q in queries:
        assert list(got[q]) == list(want[q])
        assert list(got[q].values()) == pytest.approx(list(want[q].values()), abs=1e-4)
    assert back.detect(queries) == pytest.approx(method.detect(queries))
    assert not any(f.endswith((".pkl", ".pt", ".bin")) for _, _, fs in os.walk(tmp_path) for f in fs)


def test_semantic_stage_is_reused_from_the_cache(trained, with_negatives):
    method, _, _root, run = trained
    again = MassToolMethod(**{**method.config(), "epochs": 1})
    assert again.fit("semantic", with_negatives, run) == {"reused": 1.0}
    assert again.semantic_dir == method.semantic_dir


def test_retrieval_loss_without_relevant_tools_is_a_finite_zero():
    scores = torch.tensor([[2.0, float("-inf"), 0.5]], requires_grad=True)
    loss = retrieval_loss(scores, torch.zeros(1, 3, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(scores.grad).all()


def test_semantic_cache_key_follows_the_split_content(trained, with_negatives):
    from dataclasses import replace

    method, _, _root, run = trained
    train, valid = dict(with_negatives.qrels["train"]), dict(with_negatives.qrels["valid"])
    t, v = next(iter(train)), next(iter(valid))
    train[v], valid[t] = valid.pop(v), train.pop(t)  # same row counts, another split
    swapped = replace(with_negatives, qrels={**with_negatives.qrels, "train": train, "valid": valid})
    key = method._semantic_key(with_negatives, run.seed)
    assert method._semantic_key(swapped, run.seed) != key
    assert method._semantic_key(with_negatives, run.seed + 1) != key
    # Same train and valid, one tool held out (only a test_unseen query needs it): the scratch
    # tokenizer no longer learns its text, so a cached encoder from the full catalogue must not do.
    tool = sorted(with_negatives.corpus)[0]
    unseen = {"held-out-query": {tool: 1}}
    stripped = {
        s: {q: r for q, r in split.items() if tool not in r} for s, split in with_negatives.qrels.items()
    }
    base = replace(with_negatives, qrels=stripped)
    held = replace(base, qrels={**base.qrels, "test_unseen": unseen})
    assert base.known_tools() != held.known_tools()
    assert method._semantic_key(held, run.seed) != method._semantic_key(base, run.seed)


def test_retrieval_loss_ignores_masked_non_candidates():
    scores = torch.tensor([[2.0, float("-inf"), 0.5]], requires_grad=True)
    relevant = torch.tensor([[True, False, False]])
    loss = retrieval_loss(scores, relevant)
    loss.backward()
    torch.testing.assert_close(loss, -torch.log_softmax(torch.tensor([2.0, 0.5]), 0)[0])
    assert torch.isfinite(scores.grad).all()


def test_frozen_encoder_uses_precomputed_embeddings(with_negatives, tmp_path):

    from components.encoders.bi_encoder import BiEncoder

    encoder = TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), list(with_negatives.queries.values()))
    BiEncoder(encoder).save(str(tmp_path / "semantic"))
    params = MassToolParams(dim=16, detection_hidden=8, finetune_encoder=False, edge_dropout=0.0)
    task = MassToolTask(joint_stage(params, with_negatives, str(tmp_path / "semantic")))
    model = task.build_model()
    task.start_epoch(model, 0)
    assert not any(p.requires_grad for p in model.encoder.parameters())
    batch = task.collate(task.train_data()[:8] + task.train_data()[-3:])
    assert "semantic" in batch
    model.eval()
    cached = task.loss(model, batch)
    recomputed = task.loss(model, {k: v for k, v in batch.items() if k != "semantic"})
    torch.testing.assert_close(cached, recomputed, atol=1e-5, rtol=1e-4)


def test_a_training_query_does_not_reach_its_own_tools_through_the_graph(small_quickstart, graphs):
    # At inference a query is never a graph node; in training its own edges are left out of its
    # step's propagation, so its relevant tools' embeddings cannot contain its own input.
    model = tiny_model(small_quickstart, graphs, edge_dropout=0.0).eval()
    q = 0
    tools = torch.as_tensor(graphs.query_tool[1][graphs.query_tool[0] == q])
    x = model.query_proj(model.pool)
    moved = x.clone()
    moved[q] += 10.0
    hide = torch.tensor([q])
    hidden = model.gcn(x, model.tool_text, hide=hide)[1][tools]
    torch.testing.assert_close(model.gcn(moved, model.tool_text, hide=hide)[1][tools], hidden)
    shown = model.gcn(x, model.tool_text)[1][tools]
    assert not torch.allclose(model.gcn(moved, model.tool_text)[1][tools], shown)


def test_training_step_hides_the_batch_queries_edges_unless_switched_off(small_quickstart, graphs):
    seen = []
    for hide in (True, False):
        model = tiny_model(small_quickstart, graphs, edge_dropout=0.0, hide_batch_edges=hide).train()
        calls = []
        original = model.gcn.propagate
        model.gcn.propagate = lambda x, edges, hidden=None, _o=original, _c=calls: (
            _c.append(hidden),
            _o(x, edges, hidden),
        )[1]
        tokens = model.encoder.tokenizer(["weather in paris"] * 2, return_tensors="pt", padding=True)
        model(tokens["input_ids"], tokens["attention_mask"], torch.tensor([3, 7]))
        seen.append(calls[0])
    assert seen[0].tolist() == [3, 7] and seen[1] is None


def test_the_query_views_a_training_step_contrasts_are_not_its_hidden_batch(small_quickstart, graphs):
    # A batch query's edges are hidden in both views, so its two readouts were the same vector
    # (its input over layers + 1) and the query term of the loss gave the scene view nothing.
    # Contrasted instead: other training queries, whose scene edges reach the scene embeddings.
    torch.manual_seed(0)
    model = tiny_model(small_quickstart, graphs, edge_dropout=0.0).train()
    model.gcn.cl_tools[:] = False  # the tool term off: only the query views remain
    tokens = model.encoder.tokenizer(["weather in paris"] * 4, return_tensors="pt", padding=True)
    batch = torch.tensor([3, 7, 11, 19])
    picked = model.contrast_queries(batch, batch)
    assert len(picked) == 4 and not set(picked.tolist()) & set(batch.tolist())
    out = model(tokens["input_ids"], tokens["attention_mask"], batch)
    out["cl"].backward()
    assert out["cl"].item() > 0 and model.gcn.scene_emb.weight.grad.abs().sum() > 0
    # Without hidden edges the batch's own views differ, and they are what is contrasted.
    assert torch.equal(model.contrast_queries(batch, None), batch)


def test_edge_dropout_keeps_both_directions_of_an_edge(small_quickstart, graphs):
    model = tiny_model(small_quickstart, graphs, edge_dropout=0.5).train()
    n = graphs.n_queries + graphs.n_tools
    dropped = model.gcn.propagation_matrix(model.gcn.tool_edges, n, None).to_dense() > 0
    every = model.eval().gcn.propagation_matrix(model.gcn.tool_edges, n, None).to_dense() > 0
    assert 0 < int(dropped.sum()) < int(every.sum())
    assert not (dropped & ~every).any()
    assert torch.equal(dropped, dropped.T)


def test_sparse_propagation_gradient_is_the_dense_one(small_quickstart, graphs):
    # The layers' backward is written by hand (Âᵀ = Â): check it against autograd on the dense Â.
    model = tiny_model(small_quickstart, graphs, layers=2, edge_dropout=0.0).eval()
    gcn = model.gcn
    n = graphs.n_queries + graphs.n_tools
    hide = torch.tensor([0, 2])
    x = torch.randn(n, 16, requires_grad=True)
    weights = torch.randn(n, 16)
    (gcn.propagate(x, gcn.tool_edges, hide) * weights).sum().backward()
    dense = gcn.propagation_matrix(gcn.tool_edges, n, hide).to_dense()
    x2 = x.detach().clone().requires_grad_(True)
    (((x2 + dense @ x2 + dense @ dense @ x2) / 3) * weights).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-5, rtol=1e-4)
    # A hidden query's edges are gone: its row and column of Â are zero.
    assert not dense[0].any() and not dense[:, 2].any()


def test_sparse_propagation_runs_in_fp32_under_cpu_bf16_autocast(small_quickstart, graphs):
    # train.precision bf16 on a CPU run: autocast cast the product's operands to bf16, for which
    # the CPU's sparse CSR product has no kernel, and the joint stage failed in its first step.
    model = tiny_model(small_quickstart, graphs, layers=2, edge_dropout=0.0).eval()
    gcn = model.gcn
    n = graphs.n_queries + graphs.n_tools
    x = torch.randn(n, 16).bfloat16().requires_grad_(True)  # a bf16 input, as autocast hands it
    reference = x.detach().float().requires_grad_(True)
    weights = torch.randn(n, 16)
    (gcn.propagate(reference, gcn.tool_edges, None) * weights).sum().backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = gcn.propagate(x, gcn.tool_edges, None)
    (out.float() * weights).sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16  # the input's own dtype back
    with torch.no_grad():
        expected = gcn.propagate(reference, gcn.tool_edges, None)
    torch.testing.assert_close(out.float(), expected, atol=0.02, rtol=0.02)  # the product in fp32
    torch.testing.assert_close(x.grad.float(), reference.grad, atol=0.05, rtol=0.02)


def test_propagation_follows_edges_rewritten_in_place(small_quickstart, graphs):
    # load_state_dict copies a checkpoint's edges into the same buffer: the cached layout must not survive.
    model = tiny_model(small_quickstart, graphs, layers=1, edge_dropout=0.0).eval()
    gcn = model.gcn
    n = graphs.n_queries + graphs.n_tools
    before = gcn.propagation_matrix(gcn.tool_edges, n, None).to_dense()
    rewired = gcn.tool_edges.clone()
    rewired[1, : rewired.shape[1] // 2] = rewired[1, : rewired.shape[1] // 2].roll(1)
    rewired[0, rewired.shape[1] // 2 :] = rewired[1, : rewired.shape[1] // 2]
    gcn.tool_edges.copy_(rewired)
    after = gcn.propagation_matrix(gcn.tool_edges, n, None).to_dense()
    a = to_dense_adj(rewired, max_num_nodes=n)[0].T
    d = a.sum(1).pow(-0.5).nan_to_num(0.0, posinf=0.0)
    torch.testing.assert_close(after, d[:, None] * a * d[None, :])
    assert not torch.allclose(before, after)
    for _ in range(3):  # DDP re-broadcasts buffers in place every step: one layout, not one per step
        gcn.tool_edges.copy_(rewired)
        gcn.propagation_matrix(gcn.tool_edges, n, None)
    assert len(gcn._sorted) == 1


def test_small_pool_with_self_exclusion_gives_finite_gradients(small_quickstart, graphs):
    # K >= pool size: the excluded (-inf) entry must not be picked, or SUIM's gradient is nan.
    model = tiny_model(small_quickstart, graphs, neighbours=graphs.n_queries + 5, edge_dropout=0.0)
    own = torch.arange(4)
    sims, _ = model.search(model.pool[own], exclude=own)
    assert torch.isfinite(sims).all() and sims.shape[1] == graphs.n_queries - 1
    model.train()
    tokens = model.encoder.tokenizer(["weather in paris"] * 4, return_tensors="pt", padding=True)
    out = model(tokens["input_ids"], tokens["attention_mask"], own)
    (out["scores"].sum() + out["logit"].sum()).backward()
    assert torch.isfinite(model.suim.w_sim.grad).all()


def test_a_batch_holding_most_of_the_training_graph_is_warned_about(with_negatives, caplog):
    # Each step hides its batch's edges: a batch of 256 over a pool of ~240 queries trained on a
    # graph with no edge left, while inference propagates over all of them.
    logger = "components.methods.masstool.task"
    with caplog.at_level("WARNING", logger=logger):
        MassToolTask(joint_stage(MassToolParams(dim=16, detection_hidden=8), with_negatives, "unused"))
    assert "hides up to 100% of the" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger=logger):
        MassToolTask(joint_stage(MassToolParams(dim=16, batch_size=16), with_negatives, "unused"))
    assert "hides" not in caplog.text


def test_detection_labels_come_from_where_the_example_came_from(with_negatives, tmp_path):

    from components.encoders.bi_encoder import BiEncoder

    encoder = TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), list(with_negatives.queries.values()))
    BiEncoder(encoder).save(str(tmp_path / "semantic"))
    params = MassToolParams(dim=16, detection_hidden=8)
    task = MassToolTask(joint_stage(params, with_negatives, str(tmp_path / "semantic")))
    task.build_model()
    items = task.train_data()
    # A pool query is labelled as needing a tool, a no-tool query not; one whose judgements were
    # all zero says nothing either way (evaluation leaves it out): no detection loss from it.
    zero = (items[0][0], items[0][1], (), items[0][3])
    batch = task.collate([zero, items[1], items[-1]])
    assert batch["needs_tool"].tolist() == [1.0, 1.0, 0.0]
    assert batch["detect_weight"].tolist() == [0.0, 1.0, 1.0]
    assert "detect_weight" not in task.collate([items[1], items[-1]])  # the plain mean otherwise
    model = task.build_model()
    task.start_epoch(model, 0)
    model.train()
    losses = []
    for label in (1.0, 0.0):  # whatever that query's label, the loss is the same
        batch["needs_tool"][0] = label
        torch.manual_seed(0)
        losses.append(float(task.loss(model, batch)))
    assert losses[0] == losses[1]


def test_validation_re_embeds_the_pool_with_the_current_encoder(with_negatives, tmp_path):

    from components.encoders.bi_encoder import BiEncoder

    encoder = TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), list(with_negatives.queries.values()))
    BiEncoder(encoder).save(str(tmp_path / "semantic"))
    params = MassToolParams(dim=16, detection_hidden=8, neighbours=3)
    task = MassToolTask(joint_stage(params, with_negatives, str(tmp_path / "semantic")))
    model = task.build_model()
    task.start_epoch(model, 0)
    with torch.no_grad():  # the encoder moves, as in a fine-tuning epoch
        for p in model.encoder.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stale = model.pool.clone()
    metrics = task.validate(model)
    fresh = model.embed([with_negatives.queries[q] for q in task.graphs.query_ids])
    assert not torch.allclose(stale, fresh)
    torch.testing.assert_close(model.pool, fresh)
    assert {"detect_accuracy", "detect_f1", "detect_auroc", "joint"} <= set(metrics)


def test_select_metric_is_checked_before_training(small_quickstart):
    with pytest.raises(ValueError, match="select_metric must be one of"):
        MassToolMethod(select_metric="recall@10")
    method = MassToolMethod(select_metric="detect_auroc")
    method.semantic_dir = "unused"
    no_negatives = type(small_quickstart)(**{**small_quickstart.__dict__, "neg_split": {}})
    with pytest.raises(ValueError, match="needs no-tool queries in the valid split"):
        method.fit("joint", no_negatives, RunSpec(name="x", storage_path="/tmp/unused"))


def test_frozen_joint_stage_with_an_embedding_cache_embeds_each_text_once(with_negatives, tmp_path):
    from components.encoders.bi_encoder import BiEncoder

    encoder = TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), list(with_negatives.queries.values()))
    BiEncoder(encoder).save(str(tmp_path / "semantic"))
    plain = MassToolParams(dim=16, detection_hidden=8, finetune_encoder=False, edge_dropout=0.0)
    cached = MassToolParams(**{**plain.__dict__, "embedding_cache": str(tmp_path / "embeddings")})

    def one_epoch(params: MassToolParams) -> tuple[MassToolModel, dict[str, float]]:
        torch.manual_seed(0)
        task = MassToolTask(joint_stage(params, with_negatives, str(tmp_path / "semantic")))
        model = task.build_model()
        task.start_epoch(model, 0)
        return model, task.validate(model)

    reference, want = one_epoch(plain)
    first, got = one_epoch(cached)  # fills the cache
    second, again = one_epoch(cached)  # a later trial: every embedding read back
    assert got == want and again == want
    torch.testing.assert_close(second.pool, reference.pool, atol=0, rtol=0)
    calls = first.embedding_cache.hits + first.embedding_cache.misses
    # (the tools are embedded twice within one epoch, for the graph and for the index: one early hit)
    assert first.embedding_cache.misses > 0
    assert second.embedding_cache.misses == 0 and second.embedding_cache.hits == calls


def test_an_embedding_cache_with_a_fine_tuned_encoder_is_a_clear_error():
    with pytest.raises(ValueError, match="embedding_cache needs finetune_encoder: false"):
        MassToolParams(embedding_cache="runs/embedding-cache")


@pytest.mark.parametrize("name", ["temperature", "cl_temperature"])
@pytest.mark.parametrize("value", [0.0, -0.05])
def test_a_temperature_that_is_not_positive_is_refused(name, value):
    # Both divide logits: 0 trained on NaN and a negative one pushed each query from its tools.
    with pytest.raises(ValueError, match=f"masstool: {name} must be > 0; got {value}"):
        MassToolParams(**{name: value})


def test_a_training_step_hides_the_twins_of_its_batch_queries(with_negatives, tmp_path):
    # Another training query with the same request (equal up to case and punctuation) was a SUIM
    # neighbour at cosine ~1 with its edges visible: it handed the batch query its own answer.
    from dataclasses import replace

    from components.encoders.bi_encoder import BiEncoder

    first, second = list(with_negatives.qrels["train"])[:2]
    queries = {**with_negatives.queries, second: with_negatives.queries[first].upper() + "!"}
    data = replace(with_negatives, queries=queries)
    encoder = TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), list(queries.values()))
    BiEncoder(encoder).save(str(tmp_path / "semantic"))
    params = MassToolParams(dim=16, detection_hidden=8, neighbours=8, edge_dropout=0.0)
    task = MassToolTask(joint_stage(params, data, str(tmp_path / "semantic")))
    model = task.build_model()
    task.start_epoch(model, 0)
    items = task.train_data()
    row = {q: i for i, q in enumerate(task.graphs.query_ids)}
    batch = task.collate([items[row[first]], items[10], items[-1]])
    assert batch["twins"].tolist() == [row[second]]
    assert task.collate([items[10], items[-1]])["twins"].numel() == 0  # no twin in that batch
    seen, hidden = [], []
    search, propagate = model.search, model.gcn.propagate
    model.search = lambda *a: seen.append(search(*a)[1]) or search(*a)
    model.gcn.propagate = lambda x, edges, h=None: hidden.append(h) or propagate(x, edges, h)
    model.train()
    task.loss(model, batch)
    assert row[second] not in seen[0].flatten().tolist()  # the twin is nobody's neighbour here
    assert row[second] in hidden[0].tolist() and row[first] in hidden[0].tolist()  # nor shows edges
    # Without hiding the batch's edges (the A/B switch), the twin is still nobody's neighbour: a
    # query is never its own, and its twin, at cosine 1, carried the same answer.
    model.cfg.hide_batch_edges = False
    seen.clear(), hidden.clear()
    task.loss(model, batch)
    assert row[second] not in seen[0].flatten().tolist()
    assert hidden[0] is None  # the graph keeps every edge, as the switch says
