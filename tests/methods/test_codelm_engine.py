"""A ToolGen model decoded on llama.cpp (``engine: llama.cpp``) retrieves what it retrieves on
transformers, keeps to the catalog, re-exports when indexing grows its vocabulary, and survives
save / load with the engine setting."""

from __future__ import annotations

import asyncio

import pytest
from conftest import QUERIES, TOOLS, write_tiny_toolgen_lm

from components.methods.toolgen.method import ToolGenMethod

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the pretrained extra) is not installed")

PARAMS = {"query_max_length": 24, "num_beams": 4}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_toolgen_lm(tmp_path_factory.mktemp("toolgen") / "lm")


def method(model_dir, corpus, **params):
    m = ToolGenMethod.from_dir(model_dir, {**PARAMS, **params})
    m.index(corpus)
    return m


def ranking(results):
    return {q: list(hits) for q, hits in results.items()}


def test_llamacpp_engine_retrieves_what_transformers_does(model_dir, tmp_path):
    corpus = {t: {"text": x} for t, x in TOOLS.items()}
    reference = method(model_dir, corpus).retrieve(QUERIES, 3)
    fast = method(model_dir, corpus, engine="llama.cpp", engine_threads=1)
    ours = fast.retrieve(QUERIES, 3)
    assert ranking(ours) == ranking(reference)
    for q in QUERIES:
        assert list(ours[q].values()) == pytest.approx(list(reference[q].values()), abs=1e-2)
    # Candidates narrow the constraint on this engine too.
    narrowed = fast.retrieve({"q1": QUERIES["q1"]}, 2, candidates={"q1": ["2", "3"]})
    assert set(narrowed["q1"]) <= {"2", "3"}
    # Saved with its engine setting, loaded back, it still decodes on llama.cpp, the same way.
    fast.save(str(tmp_path / "artifact"))
    again = ToolGenMethod.load(str(tmp_path / "artifact"))
    assert again.params.engine == "llama.cpp"
    assert ranking(again.retrieve(QUERIES, 3)) == ranking(reference)


def test_a_tool_indexed_later_gets_a_token_the_llamacpp_engine_can_generate(model_dir):
    corpus = {t: {"text": x} for t, x in TOOLS.items()}
    m = method(model_dir, corpus, engine="llama.cpp", engine_threads=1)
    m.retrieve({"q1": QUERIES["q1"]}, 2)  # exports the LM as it is now
    grown = {
        **corpus,
        "9": {
            "text": "category_name:Music, tool_name:Tune, api_name:play song, "
            "api_description:Play a song by name"
        },
    }
    m.index(grown)
    hits = m.retrieve({"q1": QUERIES["q1"]}, 1, candidates={"q1": ["9"]})
    assert list(hits["q1"]) == ["9"]  # the new token exists in the re-exported GGUF


def test_engine_settings_are_checked(model_dir):
    with pytest.raises(ValueError, match="engine must be one of"):
        ToolGenMethod.from_dir(model_dir, {**PARAMS, "engine": "sglang"})
    with pytest.raises(ValueError, match="engine vllm needs engine_endpoint"):
        ToolGenMethod.from_dir(model_dir, {**PARAMS, "engine": "vllm"})
    with pytest.raises(ValueError, match="needs 'model'"):
        ToolGenMethod.from_dir(model_dir, {**PARAMS, "engine": "vllm", "engine_endpoint": {"endpoint": "u"}})
    m = ToolGenMethod.from_dir(model_dir, PARAMS)
    with pytest.raises(ValueError, match="engine_dtype must be f32 or f16"):
        m.use_engine("llama.cpp", dtype="q4")


def test_serving_moves_a_saved_decoder_to_the_engine_the_app_names(model_dir, tmp_path):
    from pydantic import ValidationError

    from components.serving.app import ServeArgs, user_configs
    from components.serving.calibration import ScoreThreshold, save_calibration
    from components.serving.deployments import Detector
    from components.serving.models import DEFAULT_ENCODER_RUNTIME, RetrieverModel

    corpus = {t: {"text": x} for t, x in TOOLS.items()}
    saved = tmp_path / "artifact"
    method(model_dir, corpus).save(str(saved))  # saved on transformers
    reference = RetrieverModel(str(saved)).retrieve([QUERIES["q1"], QUERIES["q4"]], 3)
    served = RetrieverModel(str(saved), lm_engine="llama.cpp")
    assert served.method.params.engine == "llama.cpp"
    assert [[t for t, _ in r] for r in served.retrieve([QUERIES["q1"], QUERIES["q4"]], 3)] == [
        [t for t, _ in r] for r in reference
    ]
    # The app's setting reaches the Retriever replicas' config; a wrong one fails when the app is built.
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.jsonl").write_text(
        "".join(f'{{"_id": "{t}", "text": "{x}"}}\n' for t, x in TOOLS.items())
    )
    configs = user_configs(ServeArgs(artifact=str(saved), catalog=str(data), lm_engine="llama.cpp"))
    assert configs["Retriever"]["lm_engine"] == "llama.cpp"
    # The Detector's threshold scores with the same decoder: on the same engine, never a second one.
    assert configs["Detector"]["lm_engine"] == "llama.cpp"
    detector_file = str(tmp_path / "detector.json")
    fitted = ScoreThreshold(0.5, 1.0, 0.0, 1.0, 1, 1)
    # Kept per LM engine: the threshold was fitted on scores of the engine the replica decodes on.
    save_calibration(detector_file, str(saved), fitted, DEFAULT_ENCODER_RUNTIME, "transformers")
    with pytest.raises(ValueError, match=r"LM engine 'llama\.cpp'"):
        asyncio.run(Detector().reconfigure({**configs["Detector"], "detector_file": detector_file}))
    save_calibration(detector_file, str(saved), fitted, DEFAULT_ENCODER_RUNTIME, "llama.cpp")
    detector = Detector()
    asyncio.run(detector.reconfigure({**configs["Detector"], "detector_file": detector_file}))
    assert detector.model.method.params.engine == "llama.cpp"
    with pytest.raises(ValidationError, match="lm_engine: engine must be one of"):
        ServeArgs(artifact=str(saved), catalog=str(data), lm_engine="sglang")
    with pytest.raises(ValidationError, match="lm_engine vllm needs lm_endpoint"):
        ServeArgs(artifact=str(saved), catalog=str(data), lm_engine="vllm")
    with pytest.raises(ValidationError, match="lm_endpoint is the server of lm_engine vllm"):
        ServeArgs(artifact=str(saved), catalog=str(data), lm_endpoint={"endpoint": "u", "model": "m"})
    server = {"endpoint": "http://127.0.0.1:8000/llm/v1", "model": "toolgen"}
    configs = user_configs(
        ServeArgs(artifact=str(saved), catalog=str(data), lm_engine="vllm", lm_endpoint=server)
    )
    assert configs["Retriever"]["lm_endpoint"] == server
