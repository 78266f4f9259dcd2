"""Tool texts embedded by a pool of Ray Data actors (exercised end to end by ToolWeaver's codes
stage, tests/methods/test_toolweaver.py; on a GPU actor by tests/gpu)."""

from __future__ import annotations

import numpy as np
import pytest

from components.encoders.batch_embed import embed_local, embed_ray, load_encoder
from components.encoders.text_encoder import EncoderSpec

TEXTS = [f"tool number {i}: fetches the weather for city {i % 7}" for i in range(37)]


def test_use_gpu_on_a_cluster_without_a_gpu_is_refused_not_waited_for(ray_session):
    if ray_session.cluster_resources().get("GPU", 0) >= 1:
        pytest.skip("this Ray cluster has a GPU: tests/gpu embeds on it")
    with pytest.raises(ValueError, match="needs a GPU in the Ray cluster"):
        embed_ray(EncoderSpec(name_or_path="minilm"), TEXTS, use_gpu=True)


def test_the_actor_pool_gives_the_in_process_vectors_row_for_row(ray_session):
    # Batches of 8 over 37 texts: several blocks, whose rows Ray Data may hand back in any order.
    spec = EncoderSpec(name_or_path="minilm")
    expected = embed_local(load_encoder(spec), TEXTS, batch_size=8)
    got = embed_ray(spec, TEXTS, batch_size=8, actors=1)
    assert got.shape == expected.shape == (len(TEXTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-5)
