"""A dataset rewritten in place (a retrain's next base): marked while it runs, refused by the loader
when the rewrite stopped part-way, finished from the complete copy the mark names."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from components.data import io
from components.data.beir import finish_rewrite, rewrite_beir
from components.data.loader import REWRITING, load_dataset
from components.data.quickstart import generate_quickstart
from components.data.rejects import DatasetError


@pytest.fixture
def copies(tmp_path, monkeypatch):
    """``(base, staged)``: a dataset and a different, complete one staged beside it (relative path)."""
    generate_quickstart(str(tmp_path / "base"), seed=1, n_queries=120, n_neg=0)
    generate_quickstart(str(tmp_path / "staged"), seed=2, n_queries=150, n_neg=0)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "base", "staged"


def stop_at_the_judgements(monkeypatch, base):
    real = io.write_bytes

    def stops(path, data, options=None):
        if str(path).startswith(f"{base}/qrels/"):
            raise OSError(28, "No space left on device")
        return real(path, data, options)

    monkeypatch.setattr(io, "write_bytes", stops)
    return real


def test_a_stopped_rewrite_is_refused_then_finished_from_its_copy(copies, monkeypatch, tmp_path):
    base, staged = copies
    new = load_dataset(staged)
    real = stop_at_the_judgements(monkeypatch, base)
    with pytest.raises(OSError):
        rewrite_beir(new, str(base), staged)
    monkeypatch.setattr(io, "write_bytes", real)
    # The copy is named by its absolute path: the next round may start elsewhere.
    assert json.loads((base / REWRITING).read_text())["from"] == str(tmp_path / "staged")
    with pytest.raises(DatasetError, match="a retrain stopped while rewriting this dataset"):
        load_dataset(str(base))
    monkeypatch.chdir(tmp_path / "base")
    assert finish_rewrite(str(base)) == str(tmp_path / "staged")
    assert not (base / REWRITING).exists() and load_dataset(str(base), strict=True).queries == new.queries
    assert finish_rewrite(str(base)) is None  # nothing stopped: nothing to do


def test_a_stopped_rewrite_whose_copy_is_gone_says_what_to_do(copies, monkeypatch):
    base, staged = copies
    real = stop_at_the_judgements(monkeypatch, base)
    with pytest.raises(OSError):
        rewrite_beir(load_dataset(staged), str(base), staged)
    monkeypatch.setattr(io, "write_bytes", real)
    shutil.rmtree(staged)
    with pytest.raises(DatasetError, match=f"copy that copy over {base} and delete {base}/{REWRITING}"):
        finish_rewrite(str(base))
    assert os.path.exists(base / REWRITING)  # still refused: nothing was half-fixed


def test_ids_with_spaces_survive_a_rewrite(tmp_path):
    # MCP tool ids may hold a space ("srv/get weather"); write_beir separates pairs by tabs, but the
    # loader split them on any whitespace and rejected every such row, lost at the next rewrite.
    from dataclasses import replace

    from components.data.beir import write_beir

    generate_quickstart(str(tmp_path / "a"), seed=1, n_queries=40, n_neg=0)
    ds = load_dataset(str(tmp_path / "a"))
    tool = "srv/get weather"
    corpus = {
        **ds.corpus,
        tool: {"_id": tool, "title": "get weather", "text": "weather by city", "metadata": {}},
    }
    scene = next(iter(ds.scene_tool))
    query = next(iter(ds.query_scene["train"]))
    query_scene = {**ds.query_scene, "train": {**ds.query_scene["train"], query: "scene with space"}}
    scene_tool = {**ds.scene_tool, scene: [*ds.scene_tool[scene], tool], "scene with space": [tool]}
    ds = replace(ds, corpus=corpus, scene_tool=scene_tool, query_scene=query_scene)
    write_beir(ds, str(tmp_path / "b"))
    back = load_dataset(str(tmp_path / "b"))
    assert back.scene_tool == ds.scene_tool and back.query_scene == ds.query_scene
