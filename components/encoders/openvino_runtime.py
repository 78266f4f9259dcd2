"""Text encoders on OpenVINO, the other CPU engine issue 29 names, in fp32 or bf16.

OpenVINO compiles the same ONNX export ONNX Runtime runs (:func:`components.encoders.onnx_runtime.
export_onnx`: backbone, pooling and the hybrid n-gram channel), so the two engines are compared on
one graph. Its fp32 kernels are on a par with ONNX Runtime's for MiniLM; what it adds is bf16
inference on CPUs that multiply bf16 natively (AVX-512 BF16 or AMX): weights and activations are
rounded to bf16 (8 significant bits) inside the matrix products, which accumulate in fp32, and
unlike dynamic int8 nothing is scaled per batch, so a query's vector does not depend on the
queries batched with it. ``benchmarks/encoder_runtime.py`` measures the ranking change this costs.

On a CPU without native bf16 OpenVINO would quietly run fp32 (a bf16 emulation would be slower):
:class:`OpenVinoEncoder` reads back the precision it was compiled with and says so, rather than
letting a replica report a runtime it does not run.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

from components.encoders.onnx_runtime import graph_inputs

log = logging.getLogger(__name__)

PRECISIONS = {"openvino": "f32", "openvino-bf16": "bf16"}


class OpenVinoEncoder:
    """An exported encoder graph compiled by OpenVINO for the CPU; called like the module's forward.

    Args:
        path: The ``.onnx`` file (read once; the compiled model keeps its weights in memory).
        precision: ``"f32"`` or ``"bf16"`` (OpenVINO's inference precision hint).
        threads: Inference threads; default what torch uses in this process (a Serve replica's
            CPUs), so swapping engines does not change how many cores a replica takes.
    """

    def __init__(self, path: str, precision: str = "f32", threads: int | None = None) -> None:
        import openvino as ov

        if precision not in PRECISIONS.values():
            names = sorted(set(PRECISIONS.values()))
            raise ValueError(f"precision must be one of {names}, got {precision!r}")
        core = ov.Core()
        config = {
            "INFERENCE_PRECISION_HINT": precision,
            "INFERENCE_NUM_THREADS": int(threads or torch.get_num_threads()),
            # One request at a time per replica (@serve.batch hands it whole batches): one stream.
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
            # No pinning: replicas of one node share its cores, and pinned threads of two
            # replicas could land on the same core while another idles.
            "ENABLE_CPU_PINNING": False,
        }
        self.compiled = core.compile_model(core.read_model(path), "CPU", config)
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        if self.precision != precision:
            log.warning(
                "OpenVINO compiled this encoder in %s, not %s: this CPU (%s) has no native %s",
                self.precision,
                precision,
                core.get_property("CPU", "FULL_DEVICE_NAME"),
                precision,
            )
        self.request = self.compiled.create_infer_request()
        # One infer request holds one set of input / output buffers: calls from two threads of a
        # replica (a sync method runs in a thread pool) take turns rather than share it.
        self._lock = threading.Lock()

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        feeds = graph_inputs(input_ids, attention_mask)
        with self._lock:
            result = self.request.infer(feeds)
            # The output is the request's own buffer, overwritten by its next call: copy it.
            return torch.from_numpy(np.array(result[0], dtype=np.float32, copy=True))
