"""The encoder runtimes a serving replica can run (names only: no torch, no onnxruntime here)."""

from __future__ import annotations

# "torch": the module itself; "onnx": the exported fp32 graph on ONNX Runtime; "onnx-int8": that
# graph dynamically quantised; "openvino" / "openvino-bf16": the same graph compiled by OpenVINO in
# fp32 / bf16.
RUNTIMES = ("torch", "onnx", "onnx-int8", "openvino", "openvino-bf16")


def check_runtime(runtime: str) -> str:
    """``runtime`` if it is one of :data:`RUNTIMES`, else a ValueError naming them."""
    if runtime not in RUNTIMES:
        raise ValueError(f"encoder_runtime must be one of {list(RUNTIMES)}, got {runtime!r}")
    return runtime
