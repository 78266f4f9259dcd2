"""Trie-constrained decoding on vLLM (``lm_engine: vllm``): a ToolGen artifact's LM served by the
Ray Serve LLM app, its retrieval decoded through the app's completions endpoint.

Needs a Python environment with vLLM (``TOOLSCOUT_VLLM_PYTHON``, see tests/serving/test_llm_app.py);
without one it skips and says so.
"""

from __future__ import annotations

import os

import pytest
import requests
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import NO_VLLM, find_vllm_python, vllm_python

from components.generative.constrained import constrained_top_k
from components.generative.trie import TokenTrie
from components.generative.vllm_scorer import VLLMScorer
from components.serving.deploy import deploy_config, serve_config
from components.serving.llm_app import endpoint_url, llm_application

if find_vllm_python() is None:  # before any fixture: the session's Ray and data are not needed
    pytest.skip(NO_VLLM, allow_module_level=True)

SERVED = "toolgen"  # the model name the LLM app serves the artifact's LM under


@pytest.fixture(scope="module")
def toolgen_artifact(tmp_path_factory, dataset) -> str:
    """ToolGen over SmolLM2 with one new token per catalog tool (each token starts at the mean of its
    name's subword embeddings, so the ranking means something without training)."""
    from components.generative.packaged import resolve_lm
    from components.methods.toolgen.method import ToolGenMethod

    method = ToolGenMethod.from_dir(resolve_lm("smollm2-135m"), {"num_beams": 5, "query_max_length": 48})
    method.index(dataset.corpus)
    path = str(tmp_path_factory.mktemp("toolgen-vllm") / "artifact")
    method.save(path)
    return path


@pytest.fixture(scope="module")
def vllm_graph(toolgen_artifact, serve_instance, serving_data, bm25_versions) -> dict:
    """The LLM app serving the artifact's LM (tool tokens included) and the graph whose Retriever
    decodes the artifact on it; yields the endpoint settings the decoder uses."""
    port = int(serve_instance.rsplit(":", 1)[1])
    server = {"endpoint": endpoint_url("127.0.0.1", port), "model": SERVED, "timeout_s": 120}
    llm = llm_application(
        {
            "model": os.path.join(toolgen_artifact, "lm"),
            "model_id": SERVED,
            "max_model_len": 256,
            "tool_call_parser": None,
        },
        python=vllm_python(),
    )
    args = {
        "artifact": toolgen_artifact,
        "catalog": serving_data,
        "detector_artifact": bm25_versions["default"],  # calibrated in the detector file
        "detector_file": bm25_versions["detector_file"],
        "lm_engine": "vllm",
        "lm_endpoint": server,
    }
    deploy_config(serve_config(args, {"applications": [{}, llm]}), timeout_s=900)
    return server


def test_toolgen_on_vllm_ranks_as_on_transformers_and_only_catalog_tools(
    vllm_graph, toolgen_artifact, serve_instance, dataset
):
    from components.methods.toolgen.method import ToolGenMethod
    from components.serving.models import RetrieverModel

    queries = dict(list(dataset.split_queries("test").items())[:4])
    reference = ToolGenMethod.load(toolgen_artifact).retrieve(queries, 5)
    served = RetrieverModel(toolgen_artifact, lm_engine="vllm", lm_endpoint=vllm_graph)
    assert served.method.params.engine == "vllm"
    hits = served.method.retrieve(queries, 5)
    for q in queries:
        assert list(hits[q]) == list(reference[q])
        assert list(hits[q].values()) == pytest.approx(list(reference[q].values()), abs=1e-3)
        assert set(hits[q]) <= set(dataset.corpus)

    # Through the graph: the Retriever replica decodes on the LLM app and answers the same tools.
    for q, text in queries.items():
        r = requests.post(
            f"{serve_instance}/v1/select",
            json={"query": text, "top_k": 5, "needs_tool_threshold": 0.0},
            timeout=300,
        )
        assert r.status_code == 200, r.text
        assert [t["id"] for t in r.json()["tools"]] == list(reference[q])


def test_multi_token_codes_beam_search_on_vllm_equals_transformers(vllm_graph, toolgen_artifact, dataset):
    # ToolWeaver's codes are several tokens long: the beam search asks vLLM, at each step, for the
    # tokens the trie allows after each beam (and the end token where a code continues).
    from components.generative.bundle import load_bundle
    from components.generative.sequences import Prompter
    from components.generative.targeted import TargetedLM

    lm, tokenizer, _ = load_bundle(os.path.join(toolgen_artifact, "lm"))
    names = ["weather", "weather forecast", "flight search", "flight status", "hotel booking", "recipes"]
    trie = TokenTrie((tokenizer(n, add_special_tokens=False).input_ids, n) for n in names)
    assert trie.depth > 1
    prompter = Prompter(tokenizer)
    texts = [*list(dataset.split_queries("test").values())[:3], "will it rain in Oslo tomorrow"]
    prompts = [prompter.retrieval(t, 48) for t in texts]
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    reference = constrained_top_k(TargetedLM(lm).eval(), prompts, trie, 4, pad, num_beams=4, end_token=eos)
    # Three tokens a request, so a step that allows more is split over requests for one prompt, as
    # a catalog of more than 128 tools is (vLLM's cap).
    scorer = VLLMScorer.from_config(vllm_graph, "test", max_token_ids=3)
    assert len(trie.allowed(())) > 3
    served = constrained_top_k(scorer, prompts, trie, 4, pad, num_beams=4, end_token=eos)
    for ours, theirs in zip(served, reference, strict=True):
        assert [v for v, _ in ours] == [v for v, _ in theirs]
        assert [s for _, s in ours] == pytest.approx([s for _, s in theirs], abs=1e-3)
        assert {v for v, _ in ours} <= set(names)
