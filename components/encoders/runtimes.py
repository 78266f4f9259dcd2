"""The encoder runtimes a serving replica can run, and which one ``auto`` picks on this CPU.

No torch and no onnxruntime here; OpenVINO is imported only to ask what the CPU multiplies natively.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

# "torch": the module itself; "onnx": the exported fp32 graph on ONNX Runtime; "onnx-int8": that
# graph dynamically quantised; "openvino" / "openvino-bf16": the same graph compiled by OpenVINO in
# fp32 / bf16.
RUNTIMES = ("torch", "onnx", "onnx-int8", "openvino", "openvino-bf16")
# The fastest runtime within issue 29's 0.002 R@3 / N@3 of PyTorch on the CPU a replica runs on
# (see effective_runtime): CPUs differ in what they multiply natively, and a cluster's nodes may too.
AUTO = "auto"
CHOICES = (AUTO, *RUNTIMES)


def check_runtime(runtime: str) -> str:
    """``runtime`` if it is one of :data:`CHOICES`, else a ValueError naming them."""
    if runtime not in CHOICES:
        raise ValueError(f"encoder_runtime must be one of {list(CHOICES)}, got {runtime!r}")
    return runtime


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX), as OpenVINO's CPU plugin
    reports it: without it OpenVINO compiles a bf16 request in fp32. False where OpenVINO is not
    installed (``auto`` then runs ONNX Runtime, which needs nothing from it)."""
    try:
        import openvino as ov
    except ImportError:
        log.info("OpenVINO is not installed: encoder_runtime auto runs onnx")
        return False
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def native_runtimes() -> list[str]:
    """The :data:`RUNTIMES` that run as named on this CPU (``openvino-bf16`` only with native bf16;
    without it, it would be the ``openvino`` runtime again)."""
    return [r for r in RUNTIMES if r != "openvino-bf16" or native_bf16()]


@functools.cache
def _warn_no_bf16() -> None:
    # Once per process: every model load resolves its runtime, and the CPU does not change.
    log.warning("encoder_runtime openvino-bf16 runs as openvino (fp32): this CPU has no native bf16")


def effective_runtime(runtime: str, device: str = "cpu") -> str:
    """The runtime that will really run ``runtime`` for an encoder on ``device`` (a torch device
    type) on this machine, as models and calibrations are keyed by it (a threshold fitted on bf16
    scores does not belong to fp32 ones).

    ``auto`` is ``openvino-bf16`` where the CPU has native bf16 (the fastest runtime within the
    0.002 bound on an AVX-512 BF16 Xeon, results/encoder_runtime.md) and ``onnx`` elsewhere (the
    fastest within it on an AVX2-only EPYC, results/encoder_runtime_avx2.md); an encoder on a GPU
    stays on PyTorch, the one runtime that runs there. ``openvino-bf16`` on a CPU without native
    bf16 is ``openvino``: OpenVINO compiles it in fp32 there.
    """
    check_runtime(runtime)
    if runtime == AUTO and device != "cpu":
        return "torch"
    if runtime == AUTO:
        return "openvino-bf16" if native_bf16() else "onnx"
    if runtime == "openvino-bf16" and not native_bf16():
        _warn_no_bf16()
        return "openvino"
    return runtime
