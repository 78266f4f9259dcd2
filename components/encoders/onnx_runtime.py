"""Text encoders on ONNX Runtime, for CPU serving replicas.

A served dense or MassTool model spends most of a request in its text encoder (a 6-layer MiniLM
embeds one query in ~10-14 ms through PyTorch eager on this 2-core machine). ONNX Runtime runs the
same graph with fused attention and layer-norm kernels and without Python between the layers; its
dynamic int8 quantisation (MatMul weights int8 per output channel, their inputs quantised per call
over the whole batch, so a query's int8 vector moves slightly with its batch-mates) cuts the matrix
work again at a small cost in accuracy (see :func:`_quantize` for what stays fp32).
``benchmarks/encoder_runtime.py`` measures both against PyTorch, latency and ToolLens recall, and
decides the default.

What is exported is the whole :meth:`TextEncoder.forward`: backbone, pooling and, for a hybrid
encoder, the hashed n-gram channel, so the runtime returns exactly the vector the PyTorch module
would. Training never uses it: only :meth:`TextEncoder.encode` (inference) is routed here, and
training mode drops it. It runs on the CPU: a replica with a GPU keeps ``encoder_runtime: torch``.
"""

from __future__ import annotations

import logging
import os
import platform
import warnings

import numpy as np
import torch
from torch import nn

OPSET = 17
INPUTS = ("input_ids", "attention_mask")


class _Forward(nn.Module):
    """The encoder's forward as a graph root (input ids, mask) -> pooled vectors; with
    ``ngrams=False``, its transformer channel only."""

    def __init__(self, encoder: nn.Module, ngrams: bool = True) -> None:
        super().__init__()
        self.encoder, self.ngrams = encoder, ngrams

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.ngrams:
            return self.encoder(input_ids, attention_mask)
        return self.encoder.transformer(input_ids, attention_mask)


def export_onnx(
    encoder: nn.Module,
    sample: dict[str, torch.Tensor],
    path: str,
    quantize: bool = False,
    ngrams: bool = True,
) -> str:
    """Write ``encoder``'s forward ``(input_ids, attention_mask) -> vectors`` to ``path`` as ONNX,
    batch and length dynamic, traced on ``sample`` (a tokenized batch); with ``quantize``, the int8
    graph (see :func:`_quantize`) instead; with ``ngrams=False``, a hybrid encoder's transformer
    channel without its n-gram bag. Returns ``path``."""
    # Export in eval mode (no dropout) and leave the encoder in the mode it was in: export()
    # restores the root's mode onto its children, so the wrapper must be in eval mode too.
    was_training = encoder.training
    root = _Forward(encoder, ngrams).eval()
    args = tuple(sample[name].cpu() for name in INPUTS)
    dynamic = {name: {0: "batch", 1: "length"} for name in INPUTS} | {"embedding": {0: "batch"}}
    target = path if not quantize else path + ".fp32"
    try:
        _export(root, args, target, dynamic)
    finally:
        encoder.train(was_training)
    if quantize:
        try:
            _quantize(target, path)
        finally:
            os.remove(target)  # the fp32 graph, also when quantising fails
    return path


def _export(root: nn.Module, args: tuple[torch.Tensor, ...], target: str, dynamic: dict) -> None:
    # The tracer warns about shapes it records as constants (the n-gram orders, a causal-mask
    # test that the given attention mask already decides) and about advanced indexing with
    # negative indices, which the encoder never uses: the export tests compare every case.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=".*advanced indexing.*")
        torch.onnx.export(
            root,
            args,
            target,
            input_names=list(INPUTS),
            output_names=["embedding"],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,  # the TorchScript exporter: dynamic axes as declared, no onnxscript rewrite
        )


class _DropHint(logging.Filter):
    """Drops the quantiser's pre-processing hint (logged on the root logger at every call; the
    exported graph is already optimised), and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def _quantize(source: str, target: str) -> None:
    """Dynamic int8 of the MatMuls only, weights per output channel; embedding tables stay fp32.

    Why (chosen on valid, one query per call as a replica at low load sees them, against ONNX fp32
    on the trained MassTool MiniLM; the final figures are in
    ``benchmarks/results/encoder_runtime_masstool.md``): ONNX Runtime's default also quantises
    every Gather's table (word, position and n-gram embeddings) with one uint8 scale each. With
    those, valid R@3 moved by -0.0049 even with per-channel MatMul weights and layer 0's Q/K/V kept
    fp32 (which had looked like +0.0001 when scored in batches of 256: activation scales are taken
    over the whole batch); MatMuls only, per channel: -0.0016 one at a time, -0.0018 in batches
    of 8."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    hint = _DropHint()
    logging.getLogger().addFilter(hint)
    try:
        quantize_dynamic(
            source,
            target,
            weight_type=QuantType.QInt8,
            per_channel=True,
            # 7-bit weights on x86 without VNNI: its u8 x s8 multiply-add saturates on full-range
            # weights (ONNX Runtime's quantisation guide); with VNNI (this machine) full range.
            reduce_range=needs_reduced_range(),
            op_types_to_quantize=["MatMul"],
        )
    finally:
        logging.getLogger().removeFilter(hint)


def needs_reduced_range(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether int8 weights must keep to 7 bits here: an x86 CPU without VNNI (AVX-512 VNNI or
    AVX-VNNI); where the flags cannot be read, assumed so (the safe side costs one bit)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        with open(cpuinfo) as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return True
    return not ({"avx512_vnni", "avx_vnni"} & set(flags))


def graph_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, np.ndarray]:
    """The exported graph's inputs (:data:`INPUTS`) as the int64 arrays either engine takes."""
    return {
        "input_ids": input_ids.cpu().numpy().astype(np.int64),
        "attention_mask": attention_mask.cpu().numpy().astype(np.int64),
    }


class OnnxEncoder:
    """An exported encoder graph in an ONNX Runtime session; called like the module's forward.

    Args:
        path: The ``.onnx`` file (read once; the session keeps the model in memory).
        threads: Intra-op threads; default what torch uses in this process (a Serve replica's
            CPUs), so swapping runtimes does not change how many cores a replica takes.
    """

    def __init__(self, path: str, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or torch.get_num_threads())
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        (vectors,) = self.session.run(["embedding"], graph_inputs(input_ids, attention_mask))
        return torch.from_numpy(vectors)
