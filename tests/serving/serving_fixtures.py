"""Serving fixtures: a generated dataset, trained BM25 artifacts (two versions), a trained selector LM,
a dense artifact over a catalog with duplicated tools, and Serve's proxy on a free loopback port.

Test modules import these fixtures. This is no conftest.py on purpose: the suite imports
``tests/conftest.py`` as ``conftest`` from many modules, and a second conftest.py would shadow it.
Because each importing module registers its own copy of a fixture, the expensive builds are cached
per process (:func:`functools.cache`), so the selector LM is trained once per test run.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import SELECTOR_LM, free_port

from components.data import open_dataset
from components.data.types import Dataset
from components.methods import build
from components.registry import ModelRegistry, RegistrySettings
from components.serving.catalog import ToolCatalog, load_catalog
from components.serving.models import calibrate_artifact


@functools.cache
def _root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="toolscout-serving-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def _data() -> str:
    """A generated dataset with enough no-tool queries to calibrate a detector on valid."""
    from components.data.quickstart import generate_quickstart

    root = _root() / "data"
    generate_quickstart(str(root), seed=5, n_queries=1200, n_neg=400)
    return str(root)


@functools.cache
def _bm25_versions() -> dict[str, str]:
    root = _root() / "models" / "bm25"
    detector_file = str(_root() / "detector.json")
    registry = ModelRegistry(RegistrySettings(root=str(_root() / "registry")))
    out = {"root": str(root), "detector_file": detector_file, "registry": registry.settings.as_config()}
    data = open_dataset(_data())
    for number, profile in enumerate(("default", "lucene"), start=1):
        method = build("bm25", {"profile": profile})
        method.index(data.corpus)
        version = str(root / f"v{number:04d}")
        method.save(version)
        calibrate_artifact(version, _data(), detector_file)
        out[profile] = version
        # The same two versions in the registry, v2 the champion and v1 previous: models:/bm25@champion.
        registered = registry.log_version("bm25", version)
        registry.promote("bm25", registered.number)
        calibrate_artifact(registry.local_dir(registered), _data(), detector_file)
    return out


@functools.cache
def _selector_lm() -> tuple[str, dict[str, Any]]:
    from conftest import LOCAL_MODE

    from components.serving.selector_train import train_selector_lm
    from components.training.spec import RunSpec

    out = str(_root() / "selector_lm")
    run = RunSpec(name="selector", storage_path=f"{out}.train", local_dir=f"{out}.train/local", **LOCAL_MODE)
    # Trained in this process (local mode) with torch's default threads, both cores: nothing else
    # runs meanwhile (each module deletes its Serve apps). 200 steps leave the trained selector as
    # far clear of the untrained one in test_selector.py as 300 did (accuracy 0.48 at 200 steps,
    # 0.44 at 300, 0.35 at 150; untrained 0.17; the test asks for a 0.15 lead), ~4 s sooner.
    report = train_selector_lm(
        open_dataset(_data()),
        load_catalog(_data()),
        out,
        lm=SELECTOR_LM,
        steps=200,
        batch_size=16,
        lr=3e-3,
        run=run,
    )
    return out, report


@functools.cache
def _duplicated_dense() -> dict[str, str]:
    """A dense artifact over the tiny dataset plus an exact copy of each tool (ToolBench has such
    duplicates). Copies score exactly alike: the index must keep them in catalog order whatever k
    (``torch.topk`` alone ordered them differently for different k). The encoder is
    built and the tools embedded for real, without training: ranking quality does not matter here.
    """
    from conftest import TINY_ENCODER, TOOLS, write_tiny_dataset

    from components.encoders.bi_encoder import BiEncoder
    from components.methods.dense.method import DenseMethod

    root = _root() / "duplicated"
    data_dir = write_tiny_dataset(root / "data")
    with open(data_dir / "corpus.jsonl", "a") as f:
        for i, text in enumerate(TOOLS.values()):
            copy = {"_id": str(len(TOOLS) + i), "title": "", "text": text, "metadata": {}}
            f.write(json.dumps(copy) + "\n")
    data = open_dataset(str(data_dir))
    method = DenseMethod(encoder=TINY_ENCODER, id_head=False)
    method.initial_model(data, str(root / "init"), seed=0)
    method.model = BiEncoder.load(str(root / "init"))
    method.index(data.corpus)
    artifact = str(root / "models" / "dense" / "v0001")
    method.save(artifact)
    return {"data": str(data_dir), "artifact": artifact}


@pytest.fixture(scope="session")
def serving_root() -> Path:
    return _root()


@pytest.fixture(scope="session")
def serving_data() -> str:
    return _data()


@pytest.fixture(scope="session")
def dataset(serving_data) -> Dataset:
    return open_dataset(serving_data)


@pytest.fixture(scope="session")
def catalog(serving_data) -> ToolCatalog:
    return load_catalog(serving_data)


@pytest.fixture(scope="session")
def bm25_versions() -> dict[str, str]:
    """``bm25/v0001`` (default analyzer) and ``bm25/v0002`` (lucene), each calibrated in one file,
    and registered as versions 1 and 2 of model ``bm25`` (``registry``: its settings; v2 champion)."""
    return _bm25_versions()


@pytest.fixture(scope="session")
def selector_lm(ray_session) -> tuple[str, dict[str, Any]]:
    """A small Llama trained for 200 steps (one Ray Train stage) on train queries → tool name + weak
    arguments."""
    return _selector_lm()


@pytest.fixture(scope="session")
def duplicated_dense() -> dict[str, str]:
    """``{"data", "artifact"}``: a dense artifact whose catalog holds each tool twice."""
    return _duplicated_dense()


@functools.cache
def _serve_port() -> int:
    """The loopback port of the session's Serve HTTP proxy (one per process, see above)."""
    return free_port()


@pytest.fixture(scope="module")
def serve_instance(ray_session, request) -> Iterator[str]:
    """Serve's HTTP proxy on the session's loopback port: started by the first module that needs it
    (or again, after a test that runs its own Serve shut it down) and kept up between modules;
    starting and shutting down the controller and proxy cost ~8 s a module on 2 cores, and neither
    holds a CPU. Each module deletes its applications afterwards, so their replicas' CPUs are free
    for other modules' Ray Train runs. After the last module that needs it, Serve is shut down: an
    idle controller and proxy still poll, ~2.3 s of CPU a minute on 2 cores (measured), through
    every module that runs after them."""
    from ray import serve

    port = _serve_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})  # a no-op while it runs
    yield f"http://127.0.0.1:{port}"
    for name in serve.status().applications:
        serve.delete(name)
    if not _needed_later(request, "serve_instance"):
        serve.shutdown()


def _needed_later(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test after the requesting module, in this session's run order, uses ``fixture``."""
    items = request.session.items
    # getattr: an item that is no Python test (a doctest) has no module.
    last = max(i for i, item in enumerate(items) if getattr(item, "module", None) is request.module)
    return any(fixture in item.fixturenames for item in items[last + 1 :])


__all__ = [
    "bm25_versions",
    "catalog",
    "dataset",
    "duplicated_dense",
    "selector_lm",
    "serve_instance",
    "serving_data",
    "serving_root",
]
