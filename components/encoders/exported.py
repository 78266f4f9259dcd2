"""An encoder's inference on an exported graph: the engine a serving runtime names.

``TextEncoder.use_runtime`` asks here for the stand-in of its forward: the graph of
:func:`components.encoders.onnx_runtime.export_onnx`, run by ONNX Runtime (``onnx``,
``onnx-int8``) or compiled by OpenVINO (``openvino``, ``openvino-bf16``).
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch import nn

from components.encoders.ngram_bag import hybrid_sum
from components.encoders.onnx_runtime import OnnxEncoder, export_onnx
from components.encoders.openvino_runtime import PRECISIONS, OpenVinoEncoder
from components.encoders.runtimes import RUNTIMES


class _WithTorchNgrams:
    """An engine's transformer channel plus the encoder's n-gram bag run by PyTorch.

    For OpenVINO: its CPU plugin computes int64 tensors in int32, so the bag's rolling hash
    (int64, wrapping on overflow) lands n-grams in other buckets there and the vectors come out
    wrong. The bag is a table lookup and a mean, a small part of the encoder's work; the
    transformer, the large part, stays on the engine.
    """

    def __init__(self, engine: OpenVinoEncoder, bag: nn.Module) -> None:
        self.engine, self.bag = engine, bag

    @property
    def precision(self) -> str:
        """The precision the engine compiled the transformer channel in."""
        return self.engine.precision

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return hybrid_sum(self.engine(input_ids, attention_mask), self.bag(input_ids, attention_mask))


def exported_encoder(
    encoder: nn.Module, sample: dict[str, torch.Tensor], runtime: str
) -> OnnxEncoder | OpenVinoEncoder | _WithTorchNgrams | None:
    """The exported stand-in for ``encoder``'s inference under ``runtime`` (None for "torch"):
    the graph of :func:`export_onnx` traced on ``sample``, written to a temporary file that is gone
    once the engine has read it. ``runtime`` is one of :data:`RUNTIMES`, as
    :func:`~components.encoders.runtimes.effective_runtime` resolves it (``TextEncoder.use_runtime``)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"a resolved runtime is one of {list(RUNTIMES)}, got {runtime!r}")
    if runtime == "torch":
        return None
    bag = getattr(encoder, "ngrams", None)
    on_openvino = runtime in PRECISIONS
    with tempfile.TemporaryDirectory(prefix="toolscout-onnx-") as tmp:
        target = os.path.join(tmp, "encoder.onnx")
        export_onnx(encoder, sample, target, quantize=runtime == "onnx-int8", ngrams=not on_openvino)
        if not on_openvino:
            return OnnxEncoder(target)
        engine = OpenVinoEncoder(target, PRECISIONS[runtime])
        return engine if bag is None else _WithTorchNgrams(engine, bag)
