"""Serving fixtures: a generated dataset, trained BM25 artifacts (two versions), a trained selector LM,
and a helper that runs the real Serve app on 127.0.0.1 and returns its URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import SELECTOR_LM, free_port, torch_threads

from components.data import open_dataset
from components.data.types import Dataset
from components.methods import build
from components.registry import next_version, promote
from components.serving.catalog import ToolCatalog, load_catalog
from components.serving.models import calibrate_artifact


@pytest.fixture(scope="session")
def serving_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="session")
def serving_data(serving_root) -> str:
    """A generated dataset with enough no-tool queries to calibrate a detector on valid."""
    from components.data.quickstart import generate_quickstart

    root = serving_root / "data"
    generate_quickstart(str(root), seed=5, n_queries=1200, n_neg=400)
    return str(root)


@pytest.fixture(scope="session")
def dataset(serving_data) -> Dataset:
    return open_dataset(serving_data)


@pytest.fixture(scope="session")
def catalog(serving_data) -> ToolCatalog:
    return load_catalog(serving_data)


@pytest.fixture(scope="session")
def bm25_versions(serving_root, dataset, serving_data) -> dict[str, str]:
    """``bm25/v0001`` (default analyzer) and ``bm25/v0002`` (lucene), each calibrated in one file."""
    root = serving_root / "models" / "bm25"
    detector_file = str(serving_root / "detector.json")
    out = {"root": str(root), "detector_file": detector_file}
    for profile in ("default", "lucene"):
        method = build("bm25", {"profile": profile})
        method.index(dataset.corpus)
        version = next_version(str(root))
        method.save(version)
        promote(version)
        calibrate_artifact(version, serving_data, detector_file)
        out[profile] = version
    return out


@pytest.fixture(scope="session")
def selector_lm(serving_root, dataset, catalog) -> tuple[str, dict[str, Any]]:
    """A small Llama trained here for 400 steps on train queries → tool name + weak arguments."""
    from components.serving.selector_train import train_selector_lm

    out = str(serving_root / "selector_lm")
    with torch_threads(1):
        report = train_selector_lm(dataset, catalog, out, lm=SELECTOR_LM, steps=400, batch_size=16, lr=3e-3)
    return out, report


@pytest.fixture(scope="module")
def serve_instance(ray_session) -> Iterator[str]:
    """Serve's HTTP proxy on a free loopback port for one test module; shut down afterwards so the
    replicas' CPUs are free again for other modules' Ray Train runs."""
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
