"""The GPU paths: each method's stages on a CUDA Ray Train worker in bf16, and the models they save
scored on the CPU as the worker scored them on the GPU.

CI has no GPU, so these skip there; on a machine with one (the `device` tool's, a cluster's GPU
node): ``python -m pytest -p no:cacheprovider tests/gpu``. The CPU suite covers the same code with
the same fixtures; what only a GPU shows is a tensor left on the wrong device (the RQ-VAE's Sinkhorn
step failed so on its first GPU run), a checkpoint that keeps CUDA tensors, and scores that change
with the device.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import DENSE_TINY, MASSTOOL_TINY, TINY_LM, TOOLGEN_TINY, TOOLWEAVER_TINY

from components.encoders import contrastive
from components.encoders.contrastive import ContrastiveTask
from components.generative.hallucination import hallucination_rate
from components.generative.lm import DEVICE_ENV
from components.methods import load
from components.methods.dense.method import DenseMethod
from components.methods.masstool.method import MassToolMethod
from components.methods.toolgen.method import ToolGenMethod
from components.methods.toolweaver.method import ToolWeaverMethod
from components.metrics import evaluate_retrieval
from components.training.spec import RunSpec, StageConfig, StageInputs
from workflows.train import fit_method

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none): run tests/gpu on a GPU machine"
)


def gpu_run(root, name: str) -> RunSpec:
    """One Ray Train worker holding the GPU, bf16 autocast: the GPU profiles' settings."""
    return RunSpec(
        name=name,
        storage_path=str(root / "store"),
        local_dir=str(root / "local"),
        num_workers=1,
        use_gpu=True,
        precision="bf16",
        resources_per_worker={"CPU": 1, "GPU": 1},
    )


def rankings(method, queries: dict[str, str], k: int = 5) -> dict[str, list[str]]:
    return {q: list(r) for q, r in method.retrieve(queries, k).items()}


@pytest.mark.parametrize("tool_vectors", ["batch", "epoch"])
def test_dense_trains_on_a_gpu_worker_and_scores_alike_on_the_cpu(
    ray_session, small_quickstart, tmp_path, tool_vectors
):
    # Five tools held out of training, as the cold-start split does: with tool_vectors "epoch" the
    # loss masks them, a CPU-built mask meeting GPU scores.
    held_out = set(sorted(small_quickstart.corpus)[:5])
    train = {q: r for q, r in small_quickstart.qrels["train"].items() if not set(r) & held_out}
    data = replace(small_quickstart, qrels={**small_quickstart.qrels, "train": train})
    method = DenseMethod(**DENSE_TINY, tool_vectors=tool_vectors)
    report = method.fit("contrastive", data, gpu_run(tmp_path, f"dense-gpu-{tool_vectors}"))
    assert report["peak_memory_mb"] > 0  # the worker's CUDA allocator held the model
    # The worker chose its checkpoint on a valid score it computed on the GPU; the same task's
    # validation of the saved model, here on the CPU, gives that score.
    assert next(method.model.parameters()).device.type == "cpu"
    config = StageConfig.from_params(contrastive.TASK, "contrastive", method.params, StageInputs(data))
    task = ContrastiveTask(config)
    on_cpu = task.validate(method.model)[method.params.select_metric]
    assert on_cpu == pytest.approx(report[f"valid_{method.params.select_metric}"], abs=0.01)
    assert on_cpu > 0.3


def test_masstool_trains_both_stages_on_a_gpu_worker_and_scores_alike_on_the_cpu(
    ray_session, with_negatives, tmp_path
):
    method = MassToolMethod(**{**MASSTOOL_TINY, "epochs": 6}, semantic_cache=str(tmp_path / "cache"))
    run = gpu_run(tmp_path, "masstool-gpu")
    reports = {stage: method.fit(stage, with_negatives, run) for stage in method.stages}
    assert all(r["peak_memory_mb"] > 0 for r in reports.values())
    method.index(with_negatives.corpus)
    queries = with_negatives.split_queries("valid")
    valid = evaluate_retrieval(with_negatives.qrels["valid"], method.retrieve(queries, 10))
    assert valid["ndcg@3"] == pytest.approx(reports["joint"]["valid_ndcg@3"], abs=0.01)
    assert reports["joint"]["valid_detect_auroc"] > 0.8
    method.save(str(tmp_path / "saved"))
    loaded = load(str(tmp_path / "saved"))
    test = dict(list(with_negatives.split_queries("test").items())[:30])
    assert rankings(loaded, test) == rankings(method, test)


def trained_ndcg3(method, untrained, data) -> bool:
    """Whether ``method`` beats its LM before the tool stages by 0.2 test nDCG@3, as on the CPU."""
    untrained.index(data.corpus)
    queries = data.split_queries("test")
    before = evaluate_retrieval(data.qrels["test"], untrained.retrieve(queries, 10))["ndcg@3"]
    after = evaluate_retrieval(data.qrels["test"], method.retrieve(queries, 10))["ndcg@3"]
    print(f"{type(method).__name__}: test nDCG@3 {before:.3f} untrained, {after:.3f} trained")
    return after > before + 0.2


@pytest.fixture(scope="module")
def toolgen_gpu(ray_session, quickstart_1200, tmp_path_factory):
    root = tmp_path_factory.mktemp("toolgen-gpu")
    method = ToolGenMethod(**TOOLGEN_TINY)
    return method, fit_method(method, quickstart_1200, gpu_run(root, "toolgen-gpu")), root


def test_toolgen_trains_on_a_gpu_worker_and_decodes_alike_on_gpu_and_cpu(
    toolgen_gpu, quickstart_1200, monkeypatch
):
    method, report, root = toolgen_gpu
    stages = report["stages"]
    assert all(stages[s]["peak_memory_mb"] > 0 for s in ("memorization", "retrieval"))
    assert trained_ndcg3(
        method, ToolGenMethod.from_dir(method.stage_dirs["warmup"], TOOLGEN_TINY), quickstart_1200
    )
    queries = dict(list(quickstart_1200.split_queries("test").items())[:40])
    constrained = method.generate(queries, 5, constrained=True)
    assert hallucination_rate(constrained) == 0.0
    method.save(str(root / "saved"))
    gpu = load(str(root / "saved"))
    assert next(gpu._lm.parameters()).device.type == "cuda"  # LMs decode on the GPU by default
    on_gpu = rankings(gpu, queries)
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    cpu = load(str(root / "saved"))
    assert next(cpu._lm.parameters()).device.type == "cpu"
    on_cpu = rankings(cpu, queries)
    # Beam scores differ between devices in the last digits; a near-tie may swap, nothing more.
    same = sum(on_gpu[q] == on_cpu[q] for q in queries)
    assert same >= 0.9 * len(queries), (same, len(queries))


def test_toolweaver_trains_its_codes_and_lm_on_a_gpu_worker(toolgen_gpu, quickstart_1200, tmp_path):
    warmed = toolgen_gpu[0].stage_dirs["warmup"]
    params = {**TOOLWEAVER_TINY, "lm": {**TINY_LM, "name_or_path": warmed}}
    method = ToolWeaverMethod(**params)
    report = fit_method(method, quickstart_1200, gpu_run(tmp_path, "toolweaver-gpu"))
    codes = report["stages"]["codes"]
    assert codes["peak_memory_mb"] > 0 and codes["collision_rate_after_pass"] == 0.0
    assert len(set(method.tool_codes.values())) == len(quickstart_1200.corpus)
    untrained = ToolWeaverMethod.from_dir(method.untrained_dir(), params)
    untrained.share_codes(method)
    assert trained_ndcg3(method, untrained, quickstart_1200)
    queries = dict(list(quickstart_1200.split_queries("test").items())[:40])
    assert hallucination_rate(method.generate(queries, 5, constrained=True)) == 0.0


def test_tool_texts_are_embedded_on_the_gpu_actor_as_on_the_cpu(ray_session):
    # With use_gpu the actor held a GPU while its encoder ran on the CPU.
    from components.encoders import batch_embed
    from components.encoders.text_encoder import EncoderSpec

    texts = [f"tool number {i}: fetches the weather for city {i % 7}" for i in range(37)]
    spec = EncoderSpec(name_or_path="minilm")
    expected = batch_embed.embed_local(batch_embed.load_encoder(spec), texts)
    got = batch_embed.embed_ray(spec, texts, use_gpu=True)
    np.testing.assert_allclose(got, expected, atol=1e-3)
    actor = batch_embed._Embedder(spec, 8, use_gpu=True)
    assert next(actor.encoder.parameters()).device.type == "cuda"
