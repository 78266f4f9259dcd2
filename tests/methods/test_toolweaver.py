"""ToolWeaver: the collaborative RQ-VAE, Sinkhorn balancing, the collision pass, the code tokens,
Ray Train stages end to end, constrained retrieval, cold start and save/load."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from conftest import LOCAL_MODE, TINY_LM, TOOLWEAVER_TINY
from transformers import LlamaConfig, LlamaForCausalLM

from components.encoders.batch_embed import embed_local, load_encoder
from components.generative import sequences as td
from components.generative.constrained import constrained_top_k
from components.generative.hallucination import hallucination_rate
from components.generative.lm import train_bpe
from components.generative.targeted import TargetedLM
from components.generative.tool_tokens import ToolCodebook, add_code_tokens, code_token
from components.methods import load
from components.methods.toolweaver.balance import balanced_last_level
from components.methods.toolweaver.codes import assign, collided, collision_rate, resolve_collisions
from components.methods.toolweaver.method import QUANTIZER_TASK, ToolWeaverMethod, normalise
from components.methods.toolweaver.model import RQVAE, QuantizerConfig
from components.methods.toolweaver.params import ToolWeaverParams
from components.methods.toolweaver.task import (
    COOCCURRENCE,
    TOOLS,
    VECTORS,
    QuantizerTask,
    first_level_sharing,
)
from components.metrics import evaluate_retrieval
from components.training.checkpoints import STAGE_OUTPUT
from components.training.plain import train_in_process
from components.training.spec import RunSpec, StageConfig, StageInputs
from workflows.train import fit_method

# --- the quantizer, trained in process by the same task Ray Train runs -------------------------


def hierarchical_vectors(groups: int, members: int, dim: int = 32, seed: int = 0) -> np.ndarray:
    """Unit vectors in ``groups`` clusters of ``members`` sub-clusters of 3 points each: structure
    that a coarse-then-fine code fits and a flat codebook of the same size cannot."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(groups):
        centre = rng.normal(size=dim) * 3
        for _ in range(members):
            sub = centre + rng.normal(size=dim)
            rows += [sub + 0.05 * rng.normal(size=dim) for _ in range(3)]
    x = np.asarray(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def codes_stage(
    tmp_path, vectors: np.ndarray, weights: sp.spmatrix | None = None, batch_size: int = 64, **params
) -> StageConfig:
    """The codes stage over ``vectors`` with co-occurrence ``weights``, its inputs written to tmp_path."""
    inputs = tmp_path / "inputs"
    inputs.mkdir(parents=True)
    np.save(inputs / VECTORS, vectors)
    n = len(vectors)
    sp.save_npz(inputs / COOCCURRENCE, sp.csr_matrix(weights if weights is not None else (n, n)))
    (inputs / TOOLS).write_text(json.dumps([str(i) for i in range(n)]))
    p = ToolWeaverParams(**{"passes_per_epoch": 20, "hidden_dims": (32,), "latent_dim": 16, **params})
    return StageConfig(
        task=QUANTIZER_TASK,
        stage="codes",
        params=p,
        inputs=StageInputs(dataset=None, init_dir=str(inputs)),
        epochs=4,
        lr=3e-3,
        batch_size=batch_size,
        score="valid_score",
    )


def train_quantizer(tmp_path, vectors: np.ndarray, weights: sp.spmatrix | None = None, **params) -> tuple:
    """(model, last epoch's metrics) of the codes stage on ``vectors`` with co-occurrence ``weights``."""
    config = codes_stage(tmp_path, vectors, weights, **params)
    history = train_in_process(config, str(tmp_path / "ckpt"))
    return RQVAE.load(str(tmp_path / "ckpt" / "epoch_3" / STAGE_OUTPUT)), history[-1]


def test_residual_codes_reconstruct_better_than_one_codebook_of_the_same_size(tmp_path):
    x = hierarchical_vectors(groups=6, members=6)
    # Nearest-code assignment in both (balancing would trade reconstruction for spread codes).
    common = {"sinkhorn_epsilon": 0.0, "passes_per_epoch": 60}
    _, residual = train_quantizer(tmp_path / "rq", x, levels=2, codebook_size=8, **common)
    _, flat = train_quantizer(tmp_path / "flat", x, levels=1, codebook_size=16, **common)
    # Measured 0.096 against 0.124: 64 addresses for 36 sub-clusters against 16.
    assert residual["valid_reconstruction"] < 0.9 * flat["valid_reconstruction"], (residual, flat)


def test_collaborative_weight_makes_co_used_tools_share_first_level_codes(tmp_path):
    # 96 tools in 12 text clusters; each planted pair couples tools of two *different* clusters,
    # so text alone would give them different first-level codes.
    x = hierarchical_vectors(groups=12, members=4, seed=1)
    n = len(x)
    rng = np.random.default_rng(0)
    order = rng.permutation(n)
    pairs = [(a, b) for a, b in zip(order[: n // 2], order[n // 2 :], strict=True) if a // 12 != b // 12]
    counts = sp.coo_matrix(([5.0] * len(pairs), tuple(np.array(pairs).T)), shape=(n, n)).tocsr()
    weights = normalise(counts + counts.T, "symmetric")
    common = {"levels": 2, "codebook_size": 12}
    _, plain = train_quantizer(tmp_path / "l0", x, weights, collab_weight=0.0, **common)
    _, collab = train_quantizer(tmp_path / "l10", x, weights, collab_weight=10.0, **common)
    shared0, shared10 = plain["valid_co_used_first_level_shared"], collab["valid_co_used_first_level_shared"]
    assert shared10 > shared0 + 0.2, (shared0, shared10)


def test_a_tool_repeated_in_a_batch_is_balanced_once_and_its_copies_share_its_code():
    # The catalogue passes several times an epoch, shuffled as one list, so a batch can hold a tool
    # more than once; counted as several tools in Sinkhorn, its copies took capacity from the rest
    # of the prefix. Here four tools, each nearest its own code, and tool 0 seven times.
    torch.manual_seed(0)
    config = QuantizerConfig(input_dim=8, hidden_dims=(16,), latent_dim=4, levels=1, codebook_size=4)
    model = RQVAE(config)
    z = torch.randn(4, 4)
    with torch.no_grad():
        model.codebooks[0] = z + 0.01 * torch.randn(4, 4)
    rows = torch.tensor([0] * 7 + [1, 2, 3])
    once, _, _ = model.quantize(z, 0.03, 50)
    assert once[:, 0].tolist() == [0, 1, 2, 3]
    repeated, _, _ = model.quantize(z[rows], 0.03, 50, ids=rows)
    assert torch.equal(repeated, once[rows])  # as if each tool came once
    counted, _, _ = model.quantize(z[rows], 0.03, 50)  # the copies counted as tools
    assert len(set(counted[6:, 0].tolist())) < 4  # pushed two of the other tools onto one code


def test_collab_scale_catalog_undoes_the_share_of_co_users_a_batch_sees(tmp_path):
    # A batch of B over N tools holds (B - 1)/(N - 1) of a tool's co-users on average, so with the
    # default scaling a λ chosen on one catalogue acts far more weakly on a larger one.
    x = hierarchical_vectors(groups=12, members=4, seed=1)
    n = len(x)
    weights = normalise(sp.csr_matrix(np.ones((n, n)) - np.eye(n)), "symmetric")

    def collab_terms(rows: list[int]) -> tuple[float, float]:
        losses, run = {}, tmp_path / str(len(rows))
        for name, params in {
            "none": {"collab_weight": 0.0},
            "batch": {"collab_weight": 1.0},
            "catalog": {"collab_weight": 1.0, "collab_scale": "catalog"},
        }.items():
            task = QuantizerTask(codes_stage(run / name, x, weights, batch_size=16, **params))
            model = task.build_model()
            losses[name] = float(task.loss(model, task.collate(rows)))
        return losses["batch"] - losses["none"], losses["catalog"] - losses["none"]

    batch, catalog = collab_terms(list(range(16)))
    assert batch > 0 and catalog == pytest.approx(batch * (n - 1) / 15, rel=1e-4)
    # A batch as large as the catalogue (which then repeats in it) is scaled the same way: left
    # as is, its term was (B - 1)/(N - 1) times the per-tool one (2.5x at 100 tools, B = 256).
    batch, catalog = collab_terms(list(range(n)) + list(range(16)))
    assert batch > 0 and catalog == pytest.approx(batch * (n - 1) / (n + 15), rel=1e-4)
    with pytest.raises(ValueError, match="collab_scale must be 'batch' or 'catalog'"):
        ToolWeaverParams(collab_scale="tools")


@pytest.mark.parametrize("size, at_least", [(2, 95), (8, 85)])
def test_groups_smaller_than_k_get_their_least_distance_distinct_codes(size, at_least):
    # 100 groups of `size` rows under their own prefixes, K = 32, distances to a random codebook.
    # Uniform code marginals (size/32 each) made each row spread its mass over ~32/size codes in
    # equal parts; argmax then broke near-ties towards low code numbers: for pairs the chosen code
    # was on average the 10th nearest, and a third of the rows took code 0.
    from scipy.optimize import linear_sum_assignment

    generator = torch.Generator().manual_seed(0)
    x, codebook = torch.randn(100 * size, 16, generator=generator), torch.randn(32, 16, generator=generator)
    distances = torch.cdist(x, codebook) ** 2
    prefixes = [torch.arange(100).repeat_interleave(size)]
    codes = balanced_last_level(distances, prefixes, epsilon=0.03, iters=50).reshape(100, size)
    # ε = 0.03 keeps the plan a little soft, so a few larger groups keep a shared code (the
    # collision pass moves it) or miss the optimum by a swap: counted, not required of every group.
    distinct = best = 0
    for g in range(100):
        block = distances[g * size : (g + 1) * size].numpy()
        rows, cols = linear_sum_assignment(block)  # the least total distance with distinct codes
        distinct += len(set(codes[g].tolist())) == size
        best += block[rows, codes[g].numpy()].sum() <= block[rows, cols].sum() + 1e-4
    assert distinct >= at_least and best >= at_least, (distinct, best)


def test_sinkhorn_balancing_lowers_collisions_and_the_pass_removes_them(tmp_path):
    # 100 tools on 16 x 16 addresses: nearest-code assignment gives ~40 % of them a shared code.
    x = np.random.default_rng(0).normal(size=(100, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    model, _ = train_quantizer(tmp_path, x, levels=2, codebook_size=16, sinkhorn_epsilon=0.0)
    nearest = assign(model, x, sinkhorn_epsilon=0.0)
    balanced = assign(model, x, sinkhorn_epsilon=0.03)
    rates = collision_rate(balanced), collision_rate(nearest)
    assert rates[0] < rates[1] / 2, rates
    unique = resolve_collisions(model, x, nearest)
    assert collision_rate(nearest) > 0 and collision_rate(unique) == 0.0
    assert len({tuple(c) for c in unique}) == len(x)
    # Tools keep their code where they can: only members of a shared code move.
    kept = (unique == nearest).all(1)
    _, inverse, counts = np.unique(nearest, axis=0, return_inverse=True, return_counts=True)
    assert kept[counts[inverse.reshape(-1)] == 1].all()
    # Against codes already taken (a catalog indexed before): none of them is handed out again.
    taken = {tuple(int(c) for c in code) for code in unique[:50]}
    later = resolve_collisions(model, x[50:60], assign(model, x[50:60]), taken)
    assert not {tuple(int(c) for c in code) for code in later} & taken and collision_rate(later) == 0.0


def test_with_three_levels_every_tool_finds_a_free_code_while_the_catalog_fits():
    # 2^3 = 8 addresses. The pass looked only under the tool's own prefix and its level-2
    # neighbours (4 addresses): of eight tools quantised to (0, 0, 0) the fifth was refused.
    torch.manual_seed(0)
    model = RQVAE(QuantizerConfig(input_dim=8, hidden_dims=(8,), latent_dim=4, levels=3, codebook_size=2))
    x = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)
    codes = resolve_collisions(model, x, np.zeros((8, 3), dtype=np.int64))
    assert len({tuple(c) for c in codes}) == 8  # every address used once
    # A new tool near a first-level code whose four addresses are taken gets one under the other.
    taken = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    (new,) = resolve_collisions(model, x[:1], np.zeros((1, 3), dtype=np.int64), taken)
    assert new[0] == 1
    with pytest.raises(ValueError, match="no free code"):  # a ninth tool does not fit
        resolve_collisions(model, np.concatenate([x, x[:1]]), np.zeros((9, 3), dtype=np.int64))


def test_a_limited_fallback_on_two_levels_still_finds_the_free_addresses():
    # With L = 2 the limited search (the fallback_prefixes nearest first codes) is the top level:
    # there was nothing above it to fall back to, so five tools on one code of 16 addresses were
    # refused as if every address were in use.
    torch.manual_seed(0)
    model = RQVAE(QuantizerConfig(input_dim=6, hidden_dims=(6,), latent_dim=3, levels=2, codebook_size=4))
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(1, 6)) + 1e-3 * rng.normal(size=(5, 6))).astype(np.float32)  # one spot
    nearest = assign(model, x)
    assert len({tuple(c) for c in nearest}) == 1  # all five on one code, its first one the nearest
    codes = resolve_collisions(model, x, nearest, fallback_prefixes=1)
    assert len({tuple(c) for c in codes}) == 5


def test_the_collision_pass_says_when_codebooks_are_too_small(tmp_path):
    x = hierarchical_vectors(groups=2, members=4, seed=3)  # 24 tools
    model = RQVAE(QuantizerConfig(x.shape[1], (8,), 4, levels=2, codebook_size=4))  # 16 addresses
    model.fit_scaling(torch.as_tensor(x))
    with pytest.raises(ValueError, match="raise codebook_size or levels"):
        resolve_collisions(model, x, assign(model, x))


def test_quantizer_save_load_round_trip(tmp_path):
    # The model saved is the one built here (not itself a reload, which would lose what a reload
    # loses on both sides): standardised on shifted data, codebooks from k-means.
    x = hierarchical_vectors(groups=3, members=3, seed=4)
    model = RQVAE(QuantizerConfig(x.shape[1], (8,), 4, levels=2, codebook_size=8))
    model.fit_scaling(torch.as_tensor(x) * 3 + 1)
    model.init_codebooks(torch.as_tensor(x), 5, seed=0)
    model.save(str(tmp_path / "q"))
    again = RQVAE.load(str(tmp_path / "q"))
    state, loaded = model.state_dict(), again.state_dict()
    assert state.keys() == loaded.keys() and all(torch.equal(state[k], loaded[k]) for k in state)
    assert (assign(model, x, 0.003) == assign(again, x, 0.003)).all()
    assert {f.suffix for f in (tmp_path / "q").iterdir()} == {".json", ".safetensors"}


def test_codebooks_larger_than_the_batch_start_with_every_code_distinct(tmp_path):
    # k-means on one batch of 8 rows into K = 32 codes left 24 empty clusters, reset to copies of
    # those rows, which the nearest-code tie-break never picks: dead codes from the start.
    x = hierarchical_vectors(groups=6, members=6, seed=5)  # 108 tools
    config = codes_stage(tmp_path, x, batch_size=8, levels=2, codebook_size=32)
    model = QuantizerTask(config).build_model()
    assert len(torch.unique(model.codebooks[0], dim=0)) == 32


def test_cold_start_collisions_count_each_tool_once():
    new = np.array([[1, 2], [1, 2], [3, 4], [5, 6]])  # twins, then one on a taken code, one free
    # Before: the twins on a taken code counted 2 (taken) + 1 (shared) for 2 tools.
    assert collided(new, taken=[(3, 4), (1, 2)]) == 3
    assert collided(new, taken=[(3, 4)]) == 3
    assert collided(new[2:], taken=[]) == 0 and collided(new[:0], taken=[(1, 2)]) == 0


def test_first_level_sharing_weighs_each_pair_by_both_directions():
    # Row-normalised co-occurrence (D^-1 A) is not symmetric: pair (0, 1) weighs 1 from tool 0 and
    # 0.2 from tool 1. Each pair now weighs the mean of both: (0,1) 0.6 shared, (1,2) 0.9 not.
    weights = sp.csr_matrix(np.array([[0, 1.0, 0], [0.2, 0, 0.8], [0, 1.0, 0]]))
    codes = np.array([[0, 0], [0, 1], [1, 0]])
    assert first_level_sharing(codes, weights) == pytest.approx(0.6 / 1.5)  # was 1 / 1.8


def test_cooccurrence_normalisations():
    counts = sp.csr_matrix(np.array([[3.0, 2, 0], [2, 1, 4], [0, 4, 0]]))
    sym = normalise(counts, "symmetric").toarray()
    assert np.allclose(np.diag(sym), 0) and np.allclose(sym, sym.T)
    assert sym[0, 1] == pytest.approx(2 / np.sqrt(2 * 6))  # degrees without the diagonal: 2, 6, 4
    assert np.allclose(normalise(counts, "row").toarray().sum(1), 1)
    assert normalise(counts, "none")[1, 2] == 4


# --- code tokens and constrained decoding -------------------------------------------------------


def test_code_tokens_are_added_once_and_decoding_stays_in_the_trie():
    tokenizer = train_bpe(["weather in paris", "flights to rome", "book a table"] * 20, vocab_size=300)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    lm = LlamaForCausalLM(config)
    before = len(tokenizer)
    ids = add_code_tokens(lm, tokenizer, levels=2, size=6)
    assert len(tokenizer) == before + 12 and lm.get_input_embeddings().weight.shape[0] == before + 12
    assert tokenizer.convert_ids_to_tokens(ids[1][5]) == code_token(1, 5) == "<T2_5>"
    assert add_code_tokens(lm, tokenizer, levels=2, size=6) == ids and len(tokenizer) == before + 12
    # Seven tools on 36 addresses: two share a first-level code, so the trie branches at level 2.
    codes = {f"t{i}": (i % 6, i // 6) for i in range(7)}
    codebook = ToolCodebook({t: [ids[0][a], ids[1][b]] for t, (a, b) in codes.items()})
    prompts = [tokenizer("weather in paris")["input_ids"], tokenizer("book a table")["input_ids"]]
    hits = constrained_top_k(TargetedLM(lm), prompts, codebook.trie(), 7, tokenizer.pad_token_id, num_beams=7)
    assert all(sorted(t for t, _ in h) == sorted(codes) for h in hits)  # all 7, no invented code


# --- the method end to end through Ray Train ----------------------------------------------------

TINY_PARAMS = TOOLWEAVER_TINY


@pytest.fixture(scope="module")
def trained(ray_session, quickstart_1200, trained_toolgen, tmp_path_factory):
    """ToolWeaver on the tiny LM that ToolGen's session run warmed up on plain text (as from any
    pretrained LM: no warm-up stage of its own), then its codes, memorization and retrieval stages."""
    root = tmp_path_factory.mktemp("toolweaver")
    warmed = trained_toolgen[0].stage_dirs["warmup"]
    method = ToolWeaverMethod(**{**TINY_PARAMS, "lm": {**TINY_LM, "name_or_path": warmed}})
    run = RunSpec(
        name="tw-test", storage_path=str(root / "store"), local_dir=str(root / "local"), **LOCAL_MODE
    )
    return method, fit_method(method, quickstart_1200, run)


def test_codes_stage_gives_every_tool_a_unique_l_token_code(trained, quickstart_1200):
    method, report = trained
    codes = report["stages"]["codes"]
    assert list(report["stages"]) == ["codes", "warmup", "memorization", "retrieval", "agent"]
    assert codes["tools"] == 100 and codes["collision_rate_after_pass"] == 0.0
    assert "valid_reconstruction" in codes and codes["stage_seconds"] > 0  # a Ray Train run
    # The codes training gave (a tool added later keeps the code it gets: another test adds one).
    trained_codes = {t: c for t, c in method.codebook.codes.items() if t not in method.added_after_training}
    assert set(trained_codes) == set(quickstart_1200.corpus)
    assert all(len(c) == 2 for c in trained_codes.values())
    assert len(set(trained_codes.values())) == 100
    assert report["stages"]["agent"]["vocab_added"] == 32  # L x K, not one token per tool
    # Each level draws from its own K tokens.
    first = {c[0] for c in trained_codes.values()}
    second = {c[1] for c in trained_codes.values()}
    assert not first & second and len(first) <= 16 and len(second) <= 16


def test_trained_model_beats_untrained_and_never_names_a_missing_tool(trained, quickstart_1200):
    method, _ = trained
    data = quickstart_1200
    queries = data.split_queries("test")
    untrained = ToolWeaverMethod.from_dir(method.untrained_dir(), TINY_PARAMS)
    untrained.share_codes(method)
    untrained.index(data.corpus)
    before = evaluate_retrieval(data.qrels["test"], untrained.retrieve(queries, 10))
    after = evaluate_retrieval(data.qrels["test"], method.retrieve(queries, 10))
    assert after["ndcg@3"] > before["ndcg@3"] + 0.2, (before["ndcg@3"], after["ndcg@3"])
    some = dict(list(queries.items())[:30])
    constrained = method.generate(some, 5, constrained=True)
    assert hallucination_rate(constrained) == 0.0
    assert all(o.tool in data.corpus for beams in constrained for o in beams)
    assert all(set(r) <= set(data.corpus) for r in method.retrieve(some, 10).values())


def test_save_load_round_trip(trained, quickstart_1200, tmp_path):
    method, _ = trained
    method.save(str(tmp_path / "a"))
    files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert not any(f.endswith((".pt", ".pkl", ".bin")) for f in files)
    loaded = load(str(tmp_path / "a"))
    assert isinstance(loaded, ToolWeaverMethod) and loaded.quantizer is not None
    queries = dict(list(quickstart_1200.split_queries("test").items())[:20])
    a, b = method.retrieve(queries, 5), loaded.retrieve(queries, 5)
    assert {q: list(r) for q, r in a.items()} == {q: list(r) for q, r in b.items()}
    assert loaded.tool_codes == method.tool_codes


def test_a_new_tool_gets_a_code_from_the_quantizer_without_retraining(trained, quickstart_1200):
    method, _ = trained
    data = quickstart_1200
    fields = method.params.tool_fields
    encoder = load_encoder(method.params.encoder_spec())
    tools = list(method.tool_codes)
    vectors = embed_local(encoder, list(td.tool_documents(data.corpus, tools, fields).values()))
    codes = assign(method.quantizer, vectors)
    nearest = {t: tuple(int(c) for c in code) for t, code in zip(tools, codes, strict=True)}
    taken = set(method.tool_codes.values())
    qid = next(iter(data.qrels["test"]))
    twin = next(iter(data.qrels["test"][qid]))
    # An id no test indexed before (codes stay once given, on this module's shared model).
    new_id = "new-tool-quantized"
    assert new_id not in method.tool_codes
    corpus = {**data.corpus, new_id: {**data.corpus[twin], "_id": new_id}}  # the twin's text
    weights = method._lm.get_input_embeddings().weight.detach().clone()
    collided = method.cold_start["collided_before_pass"]
    try:
        method.index(corpus)
        assert method.added_after_training[-1] == "new-tool-quantized"
        new = method.tool_codes["new-tool-quantized"]
        assert new not in taken  # a code of its own
        # Same text, same latent, same nearest code as the twin's; a clash counts, and the pass
        # keeps the nearest prefix while it has a free last-level code.
        assert method.cold_start["collided_before_pass"] - collided == int(nearest[twin] in taken)
        prefix_free = any((*nearest[twin][:-1], c) not in taken for c in range(method.params.codebook_size))
        assert (new[:-1] == nearest[twin][:-1]) == prefix_free
        assert torch.equal(method._lm.get_input_embeddings().weight, weights)  # the LM is unchanged
        scores = method.retrieve({qid: data.queries[qid]}, 101)[qid]
        assert "new-tool-quantized" in scores and len(scores) == 101
    finally:
        method.index(data.corpus)


def test_on_vllm_a_new_tool_is_coded_without_the_weights_and_ranks_as_in_process(
    trained, quickstart_1200, tmp_path
):
    # ToolWeaver's cold start spells a new tool with existing code tokens, so a replica decoding on
    # a vLLM server of the saved LM (no weights here) codes it too, and ranks as the LM in process.
    from logprob_server import LogprobServer

    from components.generative.bundle import load_bundle

    method, _ = trained
    data = quickstart_1200
    qid = next(iter(data.qrels["test"]))
    twin = next(iter(data.qrels["test"][qid]))
    new_id = "new-tool-vllm"  # no test indexed it before: the served copy must code it itself
    assert new_id not in method.tool_codes
    corpus = {**data.corpus, new_id: {**data.corpus[twin], "_id": new_id}}
    queries = dict(list(data.split_queries("test").items())[:10])
    method.save(str(tmp_path / "a"))
    lm, _, _ = load_bundle(str(tmp_path / "a" / "lm"))
    with LogprobServer(lm) as server:
        server_cfg = {"endpoint": server.url, "model": "tw"}
        served = ToolWeaverMethod.load(str(tmp_path / "a"), {"engine": "vllm", "engine_endpoint": server_cfg})
        served.index(corpus)
        assert served.added_after_training[-1] == new_id  # coded here, on vLLM, not read from the save
        hits = served.retrieve(queries, 5)
        with pytest.raises(RuntimeError, match="free generation runs in process"):
            served.generate(queries, 5, constrained=False)  # no weights were loaded
    try:
        method.index(corpus)
        assert served.tool_codes[new_id] == method.tool_codes[new_id]
        reference = method.retrieve(queries, 5)
    finally:
        method.index(data.corpus)
    assert {q: list(h) for q, h in hits.items()} == {q: list(h) for q, h in reference.items()}


def test_bad_params_fail_on_the_driver(quickstart_1200, tmp_path):
    with pytest.raises(ValueError, match="levels must be >= 1"):
        ToolWeaverMethod(levels=0)
    with pytest.raises(ValueError, match="cooccurrence_norm"):
        ToolWeaverMethod(cooccurrence_norm="l2")
    with pytest.raises(ValueError, match="code_init must be one of"):
        ToolWeaverMethod(code_init="zeros")
    # Free outputs shorter than a code parsed as no tool: recall 0, every beam a hallucination.
    with pytest.raises(ValueError, match=r"free_max_new_tokens \(4\) must be >= levels \(5\)"):
        ToolWeaverMethod(levels=5, decoding="unconstrained")
    ToolWeaverMethod(levels=5, decoding="unconstrained", free_max_new_tokens=6)
    ToolWeaverMethod(levels=5)  # constrained decoding stops at whole codes whatever the cap
    with pytest.raises(ValueError, match="unknown codes settings"):
        ToolWeaverMethod(stages={"codes": {"epoch": 3}})
    # Accepted before, and then ignored or harmful: balancing silently off (0 iterations, ε NaN),
    # every tool code 0 (ε inf, or so small that -cost/ε overflowed), a cap nothing read.
    for bad, says in [
        ({"sinkhorn_iters": 0}, "sinkhorn_iters must be an integer >= 1"),
        ({"sinkhorn_epsilon": float("nan")}, "must be finite numbers >= 0"),
        ({"sinkhorn_epsilon": float("inf")}, "must be finite numbers >= 0"),
        ({"beta": float("inf")}, "must be finite numbers >= 0"),
        ({"sinkhorn_epsilon": 1e-40}, r"sinkhorn_epsilon must be 0 or >= 1e-6"),
        ({"kmeans_iters": -1}, "kmeans_iters must be an integer >= 0"),
        ({"latent_dim": 0}, "latent_dim must be an integer >= 1"),
        ({"hidden_dims": [0]}, "hidden_dims must be sizes >= 1"),
        ({"passes_per_epoch": 0}, "passes_per_epoch must be an integer >= 1"),
        ({"stages": {"codes": {"max_examples": 10}}}, "stages.codes takes no max_examples"),
    ]:
        with pytest.raises(ValueError, match=says):
            ToolWeaverMethod(**bad)
    ToolWeaverMethod(sinkhorn_epsilon=0.0, sinkhorn_iters=0)  # plain nearest codes: no iterations needed
    method = ToolWeaverMethod(levels=2, codebook_size=8)  # 64 addresses for 100 tools
    with pytest.raises(ValueError, match="do not fit"):
        method.fit("codes", quickstart_1200, RunSpec(local_dir=str(tmp_path)))
    with pytest.raises(RuntimeError, match="codes stage before"):
        ToolWeaverMethod().fit("retrieval", quickstart_1200, RunSpec(local_dir=str(tmp_path)))


def test_a_tool_alone_under_its_prefix_takes_its_nearest_last_code():
    # Rows 0 and 1 share a prefix; rows 2 and 3 are each alone under theirs. A uniform code
    # marginal made a lone row's plan uniform, so every lone tool got code 0 (its argmax tie).
    distances = torch.tensor(
        [[0.1, 0.3, 0.9, 0.9], [0.15, 0.2, 0.9, 0.9], [0.9, 0.9, 0.1, 0.9], [0.9, 0.9, 0.9, 0.1]]
    )
    prefixes = [torch.tensor([0, 0, 1, 2])]
    codes = balanced_last_level(distances, prefixes, epsilon=0.03, iters=50).tolist()
    assert codes[2:] == [2, 3]
    assert codes[:2] == [0, 1]  # the pair is balanced: both nearest code 0, one moves to code 1
