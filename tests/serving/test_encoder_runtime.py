"""The serve config's ``encoder_runtime`` reaches the replicas: a Retriever deployment (run in
process, without Serve) loads its dense artifact's encoder on the runtime the args name, answers as
the PyTorch one does, and an unknown runtime is refused on the driver."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import unbatched

from components.serving.app import ServeArgs, user_configs
from components.serving.retriever_deployment import Retriever


def test_the_runtime_in_the_args_is_the_one_the_retriever_replica_runs(duplicated_dense):
    data, artifact = duplicated_dense["data"], duplicated_dense["artifact"]
    query = "hotel in Berlin and the weather forecast"

    async def answer(runtime: str) -> tuple[list[str], list[str]]:
        configs = user_configs(ServeArgs(artifact=artifact, catalog=data, encoder_runtime=runtime))
        assert configs["Detector"]["encoder_runtime"] == runtime
        retriever = Retriever(data)
        unbatched(retriever, "_retrieve_batch")
        await retriever.reconfigure(configs["Retriever"])
        assert retriever.model is not None
        runtimes = [e.runtime for e in retriever.model.method.text_encoders()]
        hits = (await retriever.retrieve((query, 4)))["tools"]
        return runtimes, [h["id"] for h in hits]

    torch_runtimes, torch_ids = asyncio.run(answer("torch"))
    onnx_runtimes, onnx_ids = asyncio.run(answer("onnx"))
    assert torch_runtimes == ["torch"] and onnx_runtimes == ["onnx"]
    assert onnx_ids == torch_ids


def test_an_unknown_runtime_is_refused_when_the_args_are_read(duplicated_dense):
    with pytest.raises(ValidationError, match="encoder_runtime"):
        ServeArgs(
            artifact=duplicated_dense["artifact"],
            catalog=duplicated_dense["data"],
            encoder_runtime="tensorrt",
        )
