"""The serve config's ``encoder_runtime`` reaches the replicas: the Retriever and Detector
deployments (run in process, without Serve) load their artifact's encoder on the runtime the args
name and answer as the PyTorch one does, for dense and MassTool (both towers); a query-generation
artifact moves the retriever it wraps; an unknown runtime is refused on the driver."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import unbatched

from components.encoders.runtimes import AUTO, effective_runtime
from components.serving.app import ServeArgs, user_configs
from components.serving.deployments import Detector
from components.serving.models import load_method
from components.serving.retriever_deployment import Retriever


def test_the_runtime_in_the_args_is_the_one_the_retriever_replica_runs(duplicated_dense):
    data, artifact = duplicated_dense["data"], duplicated_dense["artifact"]
    query = "hotel in Berlin and the weather forecast"

    async def answer(runtime: str) -> tuple[list[str], list[str], float]:
        args = ServeArgs(artifact=artifact, catalog=data, calibration_data=data, encoder_runtime=runtime)
        configs = user_configs(args)
        retriever, detector = Retriever(data), Detector()
        unbatched(retriever, "_retrieve_batch")
        unbatched(detector, "_detect_batch")
        await retriever.reconfigure(configs["Retriever"])
        await detector.reconfigure(configs["Detector"])  # calibrates its threshold in the replica
        assert retriever.model is not None and detector.model is not None
        runtimes = [e.runtime for m in (retriever.model, detector.model) for e in m.method.text_encoders()]
        hits = (await retriever.retrieve((query, 4)))["tools"]
        return runtimes, [h["id"] for h in hits], (await detector.detect(query))["probability"]

    torch_runtimes, torch_ids, torch_p = asyncio.run(answer("torch"))
    onnx_runtimes, onnx_ids, onnx_p = asyncio.run(answer("onnx"))
    assert torch_runtimes == ["torch", "torch"] and onnx_runtimes == ["onnx", "onnx"]
    assert onnx_ids == torch_ids and onnx_p == pytest.approx(torch_p, abs=1e-4)


# bf16 moves a detection probability by ~1e-3 (8 significant bits in the matrix products).
@pytest.mark.parametrize("runtime, tolerance", [("onnx", 1e-4), ("openvino", 1e-4), ("openvino-bf16", 1e-2)])
def test_masstool_detects_and_retrieves_alike_on_each_exported_runtime(
    trained_masstool, with_negatives, tmp_path, runtime, tolerance
):
    trained_masstool[0].save(str(tmp_path / "masstool"))
    torch_model = load_method(str(tmp_path / "masstool"), "torch")
    exported = load_method(str(tmp_path / "masstool"), runtime)
    # openvino-bf16 runs (and is named) openvino on a CPU without native bf16.
    assert [e.runtime for e in exported.text_encoders()] == [effective_runtime(runtime)]
    queries = dict(list(with_negatives.split_queries("test").items())[:6])
    queries |= {f"neg{i}": q for i, q in enumerate(with_negatives.neg_split["test"][:4])}
    expected, got = torch_model.detect(queries), exported.detect(queries)
    assert list(got) == list(expected)
    assert [got[q] for q in queries] == pytest.approx([expected[q] for q in queries], abs=tolerance)
    ranked = lambda results: {q: sorted(r, key=r.get, reverse=True) for q, r in results.items()}  # noqa: E731
    assert ranked(exported.retrieve(queries, 5)) == ranked(torch_model.retrieve(queries, 5))


def test_an_unknown_runtime_is_refused_when_the_args_are_read(duplicated_dense):
    with pytest.raises(ValidationError, match="encoder_runtime"):
        ServeArgs(
            artifact=duplicated_dense["artifact"],
            catalog=duplicated_dense["data"],
            encoder_runtime="tensorrt",
        )


def test_auto_is_keyed_by_the_runtime_it_runs_so_driver_and_replicas_meet(duplicated_dense, tmp_path):
    """A threshold the driver fits under ``auto`` is the one a replica told the resolved runtime
    finds (and the other way round), and a Detector under ``auto`` reads a Retriever's ranking on
    that runtime: calibrations and ranking keys name what runs, never ``auto``."""
    from components.serving.calibration import find_calibration
    from components.serving.models import DetectorModel, RetrieverModel, ensure_calibration

    data, artifact = duplicated_dense["data"], duplicated_dense["artifact"]
    file = str(tmp_path / "detector.json")
    runs = effective_runtime(AUTO)
    fitted = ensure_calibration(artifact, data, file, AUTO)
    assert fitted is not None and find_calibration(file, artifact, runs) == fitted
    assert "|auto|" not in Path(file).read_text()  # no entry under a name nothing runs
    detector = DetectorModel(artifact, file, encoder_runtime=AUTO)  # no calibration data: must find it
    retriever = RetrieverModel(artifact, runs)
    assert detector.encoder_runtime == runs and detector.threshold == fitted
    assert detector.reads_ranking_of == retriever.ranking
    assert [e.runtime for e in detector.method.text_encoders()] == [runs]
