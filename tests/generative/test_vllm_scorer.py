"""The vLLM engine of the constrained decoder (``engine: vllm``), against a completions server that
answers as vLLM does: named tokens' full-softmax log-probabilities (``logprob_token_ids``), keyed
``token_id:N``, -inf written as -9999. The server computes them with the same LM in this process, so
the vLLM engine must rank exactly as transformers does. vLLM itself is exercised by
tests/serving/test_vllm_decoding.py where a vLLM environment exists."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import QUERIES, TOOLS, write_tiny_toolgen_lm
from logprob_server import LogprobServer

from components.generative.bundle import load_bundle
from components.generative.chat_endpoint import ChatEndpointError
from components.generative.constrained import constrained_top_k
from components.generative.targeted import TargetedLM, last_logprobs
from components.generative.trie import TokenTrie
from components.generative.vllm_scorer import VLLMScorer
from components.methods.toolgen.method import ToolGenMethod

PARAMS = {"query_max_length": 24, "num_beams": 4}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return write_tiny_toolgen_lm(tmp_path_factory.mktemp("toolgen") / "lm")


def method(model_dir: str, **params: Any) -> ToolGenMethod:
    m = ToolGenMethod.from_dir(model_dir, {**PARAMS, **params})
    m.index({t: {"text": x} for t, x in TOOLS.items()})
    return m


def test_vllm_engine_ranks_as_transformers_asking_only_for_catalog_tokens(model_dir):
    reference = method(model_dir).retrieve(QUERIES, 3)
    lm, _, codebook = load_bundle(model_dir)
    with LogprobServer(lm) as server:
        served = method(model_dir, engine="vllm", engine_endpoint={"endpoint": server.url, "model": "tg"})
        hits = served.retrieve(QUERIES, 3)
        narrowed = served.retrieve({"q1": QUERIES["q1"]}, 2, candidates={"q1": ["2", "3"]})
    assert {q: list(h) for q, h in hits.items()} == {q: list(h) for q, h in reference.items()}
    for q in QUERIES:
        assert list(hits[q].values()) == pytest.approx(list(reference[q].values()), abs=1e-5)
    assert set(narrowed["q1"]) <= {"2", "3"}
    # One greedy one-token completion for all the queries (they name the same tokens: the catalog's
    # tool tokens), prompts as token ids; one naming only the two candidates when narrowed; each asks
    # for as many log-probabilities as it names.
    bodies = [r["body"] for r in server.requests]
    assert len(bodies) == 2 and len(bodies[0]["prompt"]) == len(QUERIES) and len(bodies[1]["prompt"]) == 1
    tool_tokens = sorted(t for code in codebook.to_json().values() for t in code)
    assert bodies[0]["logprob_token_ids"] == tool_tokens
    assert sorted(bodies[1]["logprob_token_ids"]) == sorted(codebook.to_json()[t][0] for t in ("2", "3"))
    assert all(b["max_tokens"] == 1 and b["logprobs"] == len(b["logprob_token_ids"]) for b in bodies)
    assert all(isinstance(p, list) and b["model"] == "tg" for b in bodies for p in b["prompt"])


def test_a_step_is_split_into_requests_of_at_most_max_token_ids(model_dir):
    lm, _, _ = load_bundle(model_dir)
    with LogprobServer(lm) as server:
        config = {"endpoint": server.url, "model": "tg"}
        scorer = VLLMScorer.from_config(config, "test", max_token_ids=3, prompts_per_request=2)
        sequences = [[5, 6, 7], [8, 9], [5, 6, 7, 8]]
        logp = scorer.next_logprobs(sequences, [list(range(10, 20))] * 2 + [[11, 30]])
    # Sent concurrently (the engine batches them), so they arrive in any order: the first two
    # sequences name the same tokens and share each request, the third has its own.
    named = sorted((r["body"]["logprob_token_ids"], r["body"]["prompt"]) for r in server.requests)
    pair = [[5, 6, 7], [8, 9]]
    assert named == [
        ([10, 11, 12], pair),
        ([11, 30], [[5, 6, 7, 8]]),
        ([13, 14, 15], pair),
        ([16, 17, 18], pair),
        ([19], pair),
    ]
    full = last_logprobs(TargetedLM(lm).eval(), sequences, pad_id=0)
    for row in (0, 1):
        assert logp[row, 10:20].tolist() == pytest.approx(full[row, 10:20].tolist(), abs=1e-5)
        assert torch.isinf(logp[row, :10]).all()  # not asked for: -inf, never a made-up score
    assert logp[2, [11, 30]].tolist() == pytest.approx(full[2, [11, 30]].tolist(), abs=1e-5)
    assert torch.isinf(logp[2, 12:30]).all()
    with pytest.raises(ValueError, match="max_token_ids must be 1 to 128"):
        VLLMScorer.from_config(config, "test", max_token_ids=129)
    with pytest.raises(ValueError, match="prompts_per_request must be >= 1"):
        VLLMScorer.from_config(config, "test", prompts_per_request=0)


def test_a_server_without_logprob_token_ids_is_refused_clearly(model_dir):
    lm, _, _ = load_bundle(model_dir)
    with LogprobServer(lm, named_only=False) as server:
        served = method(model_dir, engine="vllm", engine_endpoint={"endpoint": server.url, "model": "tg"})
        with pytest.raises(ChatEndpointError, match="must be vLLM with logprob_token_ids"):
            served.retrieve({"q1": QUERIES["q1"]}, 3)


def test_multi_token_codes_decode_as_on_transformers_with_the_end_token_asked_for(model_dir):
    # ToolWeaver-like codes: several tokens, shared prefixes, and a code that a longer one extends
    # (it finishes with the end token's log-probability, which the step must ask vLLM for).
    lm, tokenizer, _ = load_bundle(model_dir)
    trie = TokenTrie([((5, 6), "a"), ((5, 6, 7), "b"), ((5, 8), "c"), ((9, 6, 7), "d"), ((9, 10), "e")])
    prompts = [tokenizer(q).input_ids for q in QUERIES.values()]
    eos = tokenizer.eos_token_id
    reference = constrained_top_k(TargetedLM(lm), prompts, trie, 4, 0, num_beams=4, end_token=eos)
    with LogprobServer(lm) as server:
        scorer = VLLMScorer.from_config({"endpoint": server.url, "model": "tg"}, "test")
        served = constrained_top_k(scorer, prompts, trie, 4, 0, num_beams=4, end_token=eos)
    assert [[v for v, _ in h] for h in served] == [[v for v, _ in h] for h in reference]
    scores = [s for h in served for _, s in h]
    assert scores == pytest.approx([s for h in reference for _, s in h], abs=1e-5)
    # The end token is asked for after code "a" (5, 6), which "b" extends, and nowhere else.
    asked = [p for r in server.requests if eos in r["body"]["logprob_token_ids"] for p in r["body"]["prompt"]]
    assert asked and all(p[-2:] == [5, 6] for p in asked)


def test_on_vllm_the_process_keeps_no_weights_and_adds_no_codes(model_dir, tmp_path):
    reference = method(model_dir).retrieve(QUERIES, 3)
    lm, _, _ = load_bundle(model_dir)
    with LogprobServer(lm) as server:
        endpoint = {"endpoint": server.url, "model": "tg"}
        m = method(model_dir)
        m.use_engine("vllm", endpoint=endpoint)  # as a serving replica told lm_engine: vllm
        with pytest.raises(RuntimeError, match="free generation runs in process"):
            m.generate({"q1": QUERIES["q1"]}, 2, constrained=False)  # the weights are gone
        assert {q: list(h) for q, h in m.retrieve(QUERIES, 3).items()} == {
            q: list(h) for q, h in reference.items()
        }
        # A tool with no code needs a new token in the LM, which the server does not have.
        grown = {**{t: {"text": x} for t, x in TOOLS.items()}, "9": {"text": "tool_name:Tune, api_name:play"}}
        with pytest.raises(ValueError, match="1 tools have no code"):
            m.index(grown)
        assert m.tool_ids == list(TOOLS)  # refused before anything changed
        # Saved on vllm (the LM copied as loaded), loaded back: no weights load, the same ranking.
        m.save(str(tmp_path / "artifact"))
        again = ToolGenMethod.load(str(tmp_path / "artifact"))
        assert again.params.engine == "vllm"
        with pytest.raises(RuntimeError, match="free generation runs in process"):
            again.generate({"q1": QUERIES["q1"]}, 2, constrained=False)
        assert list(again.retrieve({"q1": QUERIES["q1"]}, 3)["q1"]) == list(reference["q1"])
        # A serving replica told lm_engine vllm loads the artifact without its weights at all.
        from components.serving.models import RetrieverModel

        replica = RetrieverModel(str(tmp_path / "artifact"), lm_engine="vllm", lm_endpoint=endpoint)
        with pytest.raises(RuntimeError, match="free generation runs in process"):
            replica.method.generate({"q1": QUERIES["q1"]}, 2, constrained=False)
        assert [t for t, _ in replica.retrieve([QUERIES["q1"]], 3)[0]] == list(reference["q1"])
    # Back on transformers the weights load again, and the saved LM is the one it was given.
    again.use_engine("transformers")
    assert {q: list(h) for q, h in again.retrieve(QUERIES, 3).items()} == {
        q: list(h) for q, h in reference.items()
    }
    assert again.generate({"q1": QUERIES["q1"]}, 2, constrained=False)
    # Stages train and score in process: engine vllm refuses to train.
    again.use_engine("vllm", endpoint=endpoint)
    with pytest.raises(ValueError, match="engine vllm decodes on a server of a saved LM"):
        again.fit("retrieval", None, None)


def test_an_lm_that_gained_tool_tokens_goes_to_vllm_only_once_saved(model_dir, tmp_path):
    m = method(model_dir)
    grown = {**{t: {"text": x} for t, x in TOOLS.items()}, "9": {"text": "tool_name:Tune, api_name:play"}}
    m.index(grown)  # on transformers: tool 9 gets a new token, which a server of model_dir lacks
    endpoint = {"endpoint": "http://127.0.0.1:9/v1", "model": "tg"}
    with pytest.raises(ValueError, match="gained tool tokens since it was loaded"):
        m.use_engine("vllm", endpoint=endpoint)
    m.save(str(tmp_path / "artifact"))  # the LM a server can now be given
    m.use_engine("vllm", endpoint=endpoint)
    assert m.params.engine == "vllm"
