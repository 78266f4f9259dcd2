"""A sentence-transformers checkpoint's own pooling, read from its directory."""

from __future__ import annotations

import json

import pytest

from components.encoders.text_encoder import EncoderSpec


def st_checkpoint(root, pooling: dict, modules: list[str]):
    """The files of a sentence-transformers layout that say how it pools (no weights needed)."""
    (root / "1_Pooling").mkdir(parents=True)
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 8, **pooling}))
    listed = [
        {"idx": i, "name": str(i), "path": "", "type": f"sentence_transformers.models.{m}"}
        for i, m in enumerate(modules)
    ]
    (root / "modules.json").write_text(json.dumps(listed))
    return str(root)


def test_a_checkpoint_is_pooled_as_it_declares_unless_the_config_says_otherwise(tmp_path):
    # A CLS-pooled checkpoint named by its path (not a preset) was mean-pooled: another vector space.
    cls = st_checkpoint(
        tmp_path / "cls", {"pooling_mode_cls_token": True}, ["Transformer", "Pooling", "Normalize"]
    )
    assert EncoderSpec(name_or_path=cls).pooling == "cls"
    assert EncoderSpec(name_or_path=cls, pooling="mean").pooling == "mean"  # the config wins
    mean = st_checkpoint(tmp_path / "mean", {"pooling_mode_mean_tokens": True}, ["Transformer", "Pooling"])
    assert EncoderSpec(name_or_path=mean).pooling == "mean"
    assert EncoderSpec(name_or_path=str(tmp_path)).pooling == "mean"  # no layout: the default


def test_modules_beyond_pooling_and_a_pooling_it_lacks_are_refused(tmp_path):
    dense = st_checkpoint(
        tmp_path / "dense", {"pooling_mode_mean_tokens": True}, ["Transformer", "Pooling", "Dense"]
    )
    with pytest.raises(ValueError, match=r"stacks \['sentence_transformers.models.Dense'\]"):
        EncoderSpec(name_or_path=dense)
    maxed = st_checkpoint(tmp_path / "max", {"pooling_mode_max_tokens": True}, ["Transformer", "Pooling"])
    with pytest.raises(ValueError, match=r"pools by \['pooling_mode_max_tokens'\]"):
        EncoderSpec(name_or_path=maxed)
