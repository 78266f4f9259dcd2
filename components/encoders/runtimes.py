"""The encoder runtimes a serving replica can run (names only: no torch, no onnxruntime here)."""

from __future__ import annotations

# "torch": the module itself; "onnx": the exported fp32 graph; "onnx-int8": dynamically quantised.
RUNTIMES = ("torch", "onnx", "onnx-int8")


def check_runtime(runtime: str) -> str:
    """``runtime`` if it is one of :data:`RUNTIMES`, else a ValueError naming them."""
    if runtime not in RUNTIMES:
        raise ValueError(f"encoder_runtime must be one of {list(RUNTIMES)}, got {runtime!r}")
    return runtime
