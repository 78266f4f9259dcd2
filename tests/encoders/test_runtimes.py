"""``encoder_runtime: auto`` and the runtime that really runs: OpenVINO bf16 only where the CPU
multiplies bf16 natively, ONNX Runtime fp32 elsewhere, PyTorch for an encoder on a GPU."""

from __future__ import annotations

import logging

import pytest
from runtime_cases import scratch_encoder

from components.encoders import runtimes
from components.encoders.runtimes import AUTO, RUNTIMES, effective_runtime


@pytest.fixture
def bf16(monkeypatch):
    """Pretend this CPU has (True) or lacks (False) native bf16."""

    def set_to(native: bool) -> None:
        monkeypatch.setattr(runtimes, "native_bf16", lambda: native)

    return set_to


def test_auto_is_openvino_bf16_with_native_bf16_and_onnx_without(bf16):
    bf16(True)
    assert effective_runtime(AUTO) == "openvino-bf16"
    bf16(False)
    assert effective_runtime(AUTO) == "onnx"


def test_auto_keeps_an_encoder_on_a_gpu_on_pytorch(bf16):
    bf16(True)
    assert effective_runtime(AUTO, "cuda") == "torch"


def test_openvino_bf16_without_native_bf16_is_named_what_runs(bf16, caplog):
    bf16(False)
    runtimes._warn_no_bf16.cache_clear()  # warned once per process: an earlier test may have had it
    with caplog.at_level(logging.WARNING, logger="components.encoders.runtimes"):
        assert effective_runtime("openvino-bf16") == "openvino"
    assert "runs as openvino (fp32)" in caplog.text
    bf16(True)
    assert effective_runtime("openvino-bf16") == "openvino-bf16"


@pytest.mark.parametrize("runtime", [r for r in RUNTIMES if r != "openvino-bf16"])
def test_a_named_runtime_runs_as_named(bf16, runtime):
    for native in (True, False):
        bf16(native)
        assert effective_runtime(runtime) == runtime


def test_an_unknown_runtime_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"one of \['auto', 'torch', .*'openvino-bf16'\], got 'tensorrt'"):
        effective_runtime("tensorrt")


def test_native_bf16_agrees_with_the_cpu_flags():
    """OpenVINO's answer is the one that decides what it compiles; on Linux the kernel's CPU flags
    say the same thing (AVX-512 BF16 or AMX-BF16)."""
    pytest.importorskip("openvino", reason="OpenVINO is not installed")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags on this system")
    runtimes.native_bf16.cache_clear()
    assert runtimes.native_bf16() == bool({"avx512_bf16", "amx_bf16"} & set(flags))


def test_an_encoder_told_auto_names_the_runtime_it_runs(bf16):
    pytest.importorskip("onnxruntime", reason="ONNX Runtime is not installed")
    bf16(False)
    encoder = scratch_encoder()
    encoder.use_runtime(AUTO)
    assert encoder.runtime == "onnx" and type(encoder._compiled).__name__ == "OnnxEncoder"


def test_without_openvino_auto_runs_onnx(monkeypatch):
    """An install without OpenVINO still serves: auto falls to ONNX Runtime instead of failing."""
    import sys

    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    runtimes.native_bf16.cache_clear()
    try:
        assert effective_runtime(AUTO) == "onnx"
    finally:
        runtimes.native_bf16.cache_clear()  # the next caller asks the real OpenVINO again
