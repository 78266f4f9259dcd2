"""Text encoders on ONNX Runtime: the same vectors as PyTorch (fp32), close ones (int8), serving's
switch for dense and MassTool artifacts, and training untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_ENCODER, write_tiny_dataset
from runtime_cases import PARAPHRASES, TEXTS, scratch_encoder

from components.data import open_dataset
from components.encoders.bi_encoder import BiEncoder
from components.encoders.runtimes import effective_runtime
from components.encoders.text_encoder import EncoderSpec, TextEncoder
from components.methods.dense.method import DenseMethod
from components.serving.models import RetrieverModel, load_method


@pytest.mark.parametrize(
    "extra",
    # Order 12: longer than the export's sample text and than "x" or "" (3 and 2 tokens): the
    # exported graph must not keep only the orders its sample had, nor misread the short texts.
    # [CLS] pooling (tas-b, co-condenser): its row index was traced as a constant of the export
    # sample's batch of 2, so any other batch size failed in ONNX Runtime.
    [
        {},
        {"ngram_buckets": 512, "ngram_order": 3},
        {"ngram_buckets": 512, "ngram_order": 12},
        {"pooling": "cls"},
    ],
    ids=["bert", "hybrid", "hybrid-long-ngrams", "cls-pooling"],
)
def test_onnx_gives_the_vectors_pytorch_gives_at_any_batch_and_length(extra):
    encoder = scratch_encoder(**extra)
    expected = encoder.encode(TEXTS, batch_size=3)  # batches of 3 and 1, padded to different lengths
    encoder.use_runtime("onnx")
    got = encoder.encode(TEXTS, batch_size=3)
    assert encoder.runtime == "onnx"
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    # Each text alone (batch 1, its own length) goes through the same graph. With n-grams longer
    # than a text ("x" is 3 tokens), the export once traced its loop over orders with its sample's
    # length: a shorter batch sliced a negative width and failed in ONNX Runtime.
    for i, text in enumerate(TEXTS):
        torch.testing.assert_close(
            encoder.encode([text]), expected[i : i + 1], atol=1e-5, rtol=1e-4, msg=text
        )


def test_weights_loaded_in_place_after_the_export_are_the_ones_encoded():
    # New weights copied into the same modules (a checkpoint's load_state_dict) while the graph
    # was exported from the old ones: encode kept answering with the old weights.
    encoder = scratch_encoder()
    encoder.use_runtime("onnx")
    before = encoder.encode(TEXTS)
    other = TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), TEXTS * 5, seed=1)
    encoder.load_state_dict(other.state_dict())
    got = encoder.encode(TEXTS)
    assert encoder.runtime == "onnx"  # exported again, not dropped
    torch.testing.assert_close(got, other.encode(TEXTS), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got, before, atol=1e-3)


def test_training_drops_the_exported_graph_so_encode_follows_the_new_weights():
    encoder = scratch_encoder()
    encoder.use_runtime("onnx")
    assert not encoder.training  # a served encoder is in eval mode
    encoder.train()  # training changes the weights the graph was exported with: back to PyTorch
    assert encoder.runtime == "torch"
    batch = encoder.tokenize(TEXTS)
    loss = encoder(batch["input_ids"], batch["attention_mask"]).pow(2).sum()
    loss.backward()
    torch.optim.SGD(encoder.parameters(), lr=0.5).step()
    encoder.eval()
    with torch.no_grad():
        expected = encoder(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(encoder.encode(TEXTS), expected)


def test_a_copy_of_a_served_encoder_runs_on_pytorch():
    import copy
    import pickle

    encoder = scratch_encoder()
    expected = encoder.encode(TEXTS)
    encoder.use_runtime("onnx")
    for clone in (copy.deepcopy(encoder), pickle.loads(pickle.dumps(encoder))):
        assert clone.runtime == "torch" and encoder.runtime == "onnx"
        torch.testing.assert_close(clone.encode(TEXTS), expected)


def test_an_unknown_runtime_is_refused_by_name():
    encoder = scratch_encoder()
    names = r"\['auto', 'torch', 'onnx', 'onnx-int8', 'openvino', 'openvino-bf16'\]"
    with pytest.raises(ValueError, match=f"encoder_runtime must be one of {names}"):
        encoder.use_runtime("tensorrt")
    assert encoder.runtime == "torch"


def test_int8_minilm_stays_close_and_keeps_a_paraphrase_nearer_than_an_unrelated_sentence():
    encoder = TextEncoder.from_spec(EncoderSpec(name_or_path="minilm"))
    texts = PARAPHRASES
    fp32 = F.normalize(encoder.encode(texts), dim=-1)
    encoder.use_runtime("onnx-int8")
    int8 = F.normalize(encoder.encode(texts), dim=-1)
    agreement = (fp32 * int8).sum(-1)
    assert bool((agreement > 0.95).all()), agreement
    assert not torch.allclose(fp32, int8, atol=1e-4)  # quantised: not the fp32 graph again
    assert float(int8[0] @ int8[1]) > float(int8[0] @ int8[2]) + 0.2


def test_int8_quantises_matmul_weights_per_channel_and_keeps_the_embedding_tables_fp32(tmp_path):
    import onnx

    from components.encoders.onnx_runtime import export_onnx

    encoder = scratch_encoder(ngram_buckets=512, ngram_order=3)  # word, position and n-gram tables
    sample = encoder.tokenize(TEXTS[:2])
    graph = onnx.load(export_onnx(encoder, sample, str(tmp_path / "int8.onnx"), quantize=True)).graph
    ops = [n.op_type for n in graph.node]
    # ONNX Runtime's default quantises every Gather's table too, each with one uint8 scale.
    assert "DequantizeLinear" not in ops and "MatMul" not in [
        n.op_type for n in graph.node if any(i.startswith("onnx::MatMul") for i in n.input)
    ]
    scales = {i.name: list(i.dims) for i in graph.initializer}
    quantised = [n for n in graph.node if n.op_type == "MatMulInteger"]
    assert len(quantised) == 6  # Q, K, V, attention output, FFN in and out of the one tiny layer
    for node in quantised:
        weights = next(i for i in graph.initializer if i.name == node.input[1])
        # One scale per output channel, not one per matrix.
        assert scales[node.input[1].replace("_quantized", "_scale")] == [weights.dims[1]]


@pytest.mark.parametrize("vnni", [True, False])
def test_int8_weights_keep_to_7_bits_on_a_cpu_without_vnni(tmp_path, monkeypatch, vnni):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    import components.encoders.onnx_runtime as onnx_runtime

    flags = "fpu avx2 avx512f" + (" avx512_vnni" if vnni else "")
    (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    monkeypatch.setattr(onnx_runtime.platform, "machine", lambda: "x86_64")
    assert onnx_runtime.needs_reduced_range(str(tmp_path / "cpuinfo")) is not vnni
    monkeypatch.setattr(onnx_runtime, "needs_reduced_range", lambda: not vnni)
    encoder = scratch_encoder()
    path = onnx_runtime.export_onnx(
        encoder, encoder.tokenize(TEXTS[:2]), str(tmp_path / "q.onnx"), quantize=True
    )
    graph = onnx.load(path).graph
    top = max(
        int(np.abs(numpy_helper.to_array(i).astype(np.int32)).max())
        for i in graph.initializer
        if i.name.endswith("_quantized")
    )
    assert top <= 64 if not vnni else top == 127  # 7 bits without VNNI, full range with it
    # The graph still encodes close to PyTorch's.
    expected = encoder.encode(TEXTS)
    got = onnx_runtime.OnnxEncoder(path)(
        **{k: v for k, v in encoder.tokenize(TEXTS).items() if k in onnx_runtime.INPUTS}
    )
    assert F.cosine_similarity(got, expected).min() > 0.98


def test_a_quantisation_that_fails_leaves_no_fp32_graph_behind(tmp_path, monkeypatch):
    import components.encoders.onnx_runtime as onnx_runtime

    def fails(source: str, target: str) -> None:
        raise RuntimeError("quantiser failed")

    monkeypatch.setattr(onnx_runtime, "_quantize", fails)
    encoder = scratch_encoder()
    with pytest.raises(RuntimeError, match="quantiser failed"):
        onnx_runtime.export_onnx(
            encoder, encoder.tokenize(TEXTS[:2]), str(tmp_path / "int8.onnx"), quantize=True
        )
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def dense_artifact(tmp_path_factory) -> str:
    """An untrained (initial) hybrid dense model on the tiny dataset, saved as an artifact."""
    root = tmp_path_factory.mktemp("onnx-dense")
    data = open_dataset(str(write_tiny_dataset(root / "data")))
    method = DenseMethod(encoder={**TINY_ENCODER, "ngram_buckets": 512}, id_head=False)
    method.initial_model(data, str(root / "init"), seed=0)
    method.model = BiEncoder.load(str(root / "init"))
    method.index(data.corpus)
    method.save(str(root / "artifact"))
    return str(root / "artifact")


# bf16 rounds activations and weights to 8 significant bits: scores move by ~1e-3, not 1e-5.
@pytest.mark.parametrize("runtime, tolerance", [("onnx", 1e-5), ("openvino", 1e-5), ("openvino-bf16", 2e-2)])
def test_a_served_dense_artifact_ranks_alike_on_each_exported_runtime(dense_artifact, runtime, tolerance):
    artifact = dense_artifact
    queries = ["weather in Rome", "flights and hotels", "salmon recipes", "hello"]
    torch_model, exported = RetrieverModel(artifact), RetrieverModel(artifact, runtime)
    # openvino-bf16 runs (and is named) openvino on a CPU without native bf16.
    assert [e.runtime for e in exported.method.text_encoders()] == [effective_runtime(runtime)]
    for a, b in zip(torch_model.retrieve(queries, 4), exported.retrieve(queries, 4), strict=True):
        assert [t for t, _ in a] == [t for t, _ in b]
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=tolerance)


def test_bm25_has_no_encoder_to_move_and_loads_on_any_runtime(tiny_dataset, tmp_path):
    from components.methods.bm25.method import BM25Method

    method = BM25Method()
    method.index(open_dataset(str(tiny_dataset)).corpus)
    method.save(str(tmp_path / "bm25"))
    loaded = load_method(str(tmp_path / "bm25"), "onnx-int8")
    assert "text_encoders" not in loaded.capabilities and loaded.tool_ids == method.tool_ids
    with pytest.raises(ValueError, match="encoder_runtime must be one of"):
        load_method(str(tmp_path / "bm25"), "gpu")
