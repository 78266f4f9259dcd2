"""Equal configs train to equal weights: deterministic kernels, seeded RNGs, fixed tokenizers."""

from __future__ import annotations

import os

import torch
from conftest import TINY_ENCODER
from safetensors.torch import load_file

from components.encoders import EncoderSpec, TextEncoder
from components.encoders.bi_encoder import BiEncoder
from components.methods.masstool.method import JOINT_TASK
from components.methods.masstool.params import MassToolParams
from components.training.checkpoints import MODEL_STATE
from components.training.plain import train_in_process
from components.training.runner import worker_env
from components.training.spec import RunSpec, StageConfig, StageInputs


def test_gpu_workers_get_deterministic_cublas_unless_the_user_chose():
    assert worker_env(RunSpec(use_gpu=True))["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in worker_env(RunSpec(use_gpu=True, deterministic=False))
    assert worker_env(RunSpec(use_gpu=False)) == {}
    mine = RunSpec(use_gpu=True, env={"CUBLAS_WORKSPACE_CONFIG": ":16:8", "HF_HOME": "/h"})
    assert worker_env(mine) == {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "HF_HOME": "/h"}


def test_masstool_joint_stage_trains_to_identical_weights_twice(small_quickstart, tmp_path):
    # Everything built twice from texts: the tokenizer (tokenizers' own trainers gave other ids
    # per call), the encoder, then one joint epoch. At ToolLens scale SUIM's neighbour lookup also
    # backpropagates through indexing with repeated indices, whose CPU kernel accumulates in thread
    # order unless deterministic kernels are on (too small here to split across threads).
    params = MassToolParams(dim=16, detection_hidden=8, neighbours=5, epochs=1, batch_size=32)
    states = []
    for run in ("a", "b"):
        texts = list(small_quickstart.queries.values())
        semantic = str(tmp_path / run / "semantic")
        BiEncoder(TextEncoder.from_spec(EncoderSpec(**TINY_ENCODER), texts, seed=0)).save(semantic)
        config = StageConfig.from_params(JOINT_TASK, "joint", params, StageInputs(small_quickstart, semantic))
        train_in_process(config, str(tmp_path / run / "ckpt"))
        states.append(load_file(os.path.join(tmp_path / run / "ckpt" / "epoch_0", MODEL_STATE)))
    assert states[0].keys() == states[1].keys()
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), name
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the stage
