"""ToolGen: training sequences, four chained Ray Train stages, constrained retrieval, new tools, save/load."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import TINY_LM, TOOLGEN_TINY
from transformers import AutoTokenizer

from components.data.splits import prepare_splits
from components.data.tooltext import TOOL_FIELDS
from components.generative import sequences as td
from components.generative.hallucination import empty_rate, hallucination_rate, outputs_to_results
from components.generative.lm import LMSpec, build_causal_lm, save_causal_lm
from components.generative.tool_tokens import ToolCodebook, name_embedding_rows
from components.methods import load
from components.methods.toolgen.method import ToolGenMethod
from components.methods.toolgen.task import STAGE_FILE, ToolGenTask
from components.metrics import evaluate_retrieval
from components.training.spec import RunSpec
from workflows.bench import report_splits

TINY_PARAMS = TOOLGEN_TINY


@pytest.fixture(scope="module")
def tokenizer(quickstart_1200):
    texts = td.warmup_texts(quickstart_1200, list(quickstart_1200.corpus), TOOL_FIELDS, None, 0)
    return build_causal_lm(LMSpec(**TINY_LM), texts)[1]


def test_retrieval_examples_target_every_relevant_tool_at_the_tool_position(tokenizer):
    prompter = td.Prompter(tokenizer)
    codebook = ToolCodebook({"a": [900], "b": [901], "c": [902]})
    examples = td.retrieval_examples(
        prompter, {"q": "weather and flights"}, {"q": {"a": 1, "b": 1, "x": 1, "c": 0}}, codebook, 64
    )
    (example,) = examples
    cue = len(example.ids) - 3  # ... "Tool:" | a | </s>
    assert example.ids[-2:] == [900, tokenizer.eos_token_id]
    assert example.targets == [(cue, 900), (cue, 901), (cue + 1, tokenizer.eos_token_id)]
    assert example.ids[: cue + 1] == prompter.retrieval("weather and flights", 64)
    # Multi-token codes (ToolWeaver): one sequence per (query, tool) pair instead.
    longer = ToolCodebook({"a": [900, 5], "b": [901, 6]})
    pairs = td.retrieval_examples(prompter, {"q": "x"}, {"q": {"a": 1, "b": 1}}, longer, 64)
    assert [e.ids[-3:] for e in pairs] == [[900, 5, tokenizer.eos_token_id], [901, 6, tokenizer.eos_token_id]]


def test_prompts_keep_the_cue_when_truncated(tokenizer):
    prompter = td.Prompter(tokenizer)
    ids = prompter.retrieval("weather " * 200, 32)
    assert len(ids) == 32 and ids[-len(prompter.text(td.TOOL_CUE)) :] == prompter.text(td.TOOL_CUE)


def test_agent_trajectory_has_an_action_per_tool_with_schema_arguments(quickstart_1200, tokenizer):
    data = quickstart_1200
    codebook = ToolCodebook({t: [1000 + i] for i, t in enumerate(data.corpus)})
    prompter = td.Prompter(tokenizer)
    examples = td.agent_examples(prompter, data, "train", codebook, 400, limit=20)
    assert len(examples) == 20
    multi = [len(rel) for rel in data.qrels["train"].values() if len(rel) > 1]
    assert len(examples[0][2]) > 1 and len(multi) >= 20  # multi-tool queries come first
    example, positions, tools = examples[0]
    assert [example.ids[p + 1] for p in positions] == [codebook.codes[t][0] for t in tools]
    text = tokenizer.decode(example.ids)
    assert text.count("Action Input:") == len(tools) and text.rstrip().endswith("Action: Finish</s>")
    record = td.tool_records(data.corpus, [tools[0]])[tools[0]]
    assert json.loads(td.arguments(record)).keys() == {p["name"] for p in record.required_params}
    # Targets: every token after the query (thoughts, actions, arguments), none inside it.
    first = example.targets[0][0]
    assert [p for p, _ in example.targets] == list(range(first, len(example.ids) - 1))
    head = tokenizer.decode(example.ids[: first + 1])
    assert head.startswith("<s> Query:") and "Thought" not in head
    assert tokenizer.decode(example.ids[first + 1 :]).lstrip().startswith("Thought:")
    # Validation's trajectories are blind: no thought begins the next tool's description (which
    # gave the answer away to the agent accuracy that ranks the stage's checkpoints).
    blind, _, _ = td.agent_examples(prompter, data, "train", codebook, 400, limit=20, blind=True)[0]
    said = tokenizer.decode(blind.ids)
    assert td.thought(record) in text and td.thought(record) not in said
    assert said.count(td.BLIND_THOUGHT) == len(tools)
    # A codebook from an earlier LM may hold a tool this corpus has dropped: it was a KeyError.
    carried = ToolCodebook({**codebook.codes, "gone/tool": [5000]})
    again = td.agent_examples(prompter, data, "train", carried, 400, limit=20)
    assert [e[0].ids for e in again] == [e[0].ids for e in examples]


def test_cold_start_tools_are_not_known_at_training_time(quickstart_1200):
    cold = prepare_splits(quickstart_1200, mode="cold_start", unseen_fraction=0.2, seed=0)
    unseen = {t for rel in cold.qrels["test_unseen"].values() for t in rel} - {
        t for name in ("train", "valid", "test") for rel in cold.qrels[name].values() for t in rel
    }
    known = cold.known_tools()
    assert unseen and not unseen & set(known) and len(known) + len(unseen) == len(cold.corpus)
    assert quickstart_1200.known_tools() == list(quickstart_1200.corpus)


def test_a_pretrained_path_skips_building_and_stages_start_from_it(quickstart_1200, tmp_path):
    lm, tok = build_causal_lm(LMSpec(**TINY_LM), ["weather forecast in paris", "flights to rome"] * 20)
    save_causal_lm(lm, tok, str(tmp_path / "hub"))
    method = ToolGenMethod(lm={"name_or_path": str(tmp_path / "hub")})
    run = RunSpec(name="x", storage_path=str(tmp_path / "runs"), local_dir=str(tmp_path / "local"))
    assert method.initial_model(quickstart_1200, run) == str(tmp_path / "hub")  # loaded, not rebuilt
    task = ToolGenTask(method.stage_config("memorization", str(tmp_path / "hub"), quickstart_1200))
    model = task.build_model()
    assert len(task.codebook) == len(quickstart_1200.corpus)
    assert (
        model.lm.get_input_embeddings().weight.shape[0]
        == len(AutoTokenizer.from_pretrained(tmp_path / "hub")) + 100
    )
    # No plain-text warm-up for a pretrained LM (even with warm-up epochs configured): no Ray run.
    method = ToolGenMethod(
        lm={"name_or_path": str(tmp_path / "hub")}, stages={"warmup": {"epochs": 1}}, perplexity_texts=0
    )
    out = method.fit("warmup", quickstart_1200, run)
    assert out["stage_seconds"] == 0.0 and method.stage_dirs["warmup"] == str(tmp_path / "hub")
    assert not (tmp_path / "local").exists()


def test_select_metric_is_checked_on_the_driver():
    with pytest.raises(ValueError, match="select_metric must be one of"):
        ToolGenMethod(select_metric="mrr")
    # Free decoding needs the LM in process, which engine vllm does not keep: every retrieve failed.
    with pytest.raises(ValueError, match="decoding unconstrained generates in process; engine vllm"):
        ToolGenMethod(
            decoding="unconstrained",
            engine="vllm",
            engine_endpoint={"endpoint": "http://127.0.0.1:9/v1", "model": "m"},
        )
    # 0 examples meant none in one stage and every trajectory in the agent stage.
    with pytest.raises(ValueError, match=r"stages.agent.max_examples must be >= 1 \(or null: all\), got 0"):
        ToolGenMethod(stages={"agent": {"max_examples": 0}})


@pytest.mark.parametrize(
    "given, says",
    [
        # Refused only when the agent stage began, after the stages before it trained.
        ({"stages": {"agent": {"batch_size": 0}}}, r"stages\.agent\.batch_size must be an integer >= 1"),
        ({"stages": {"agent": {"lr": -1}}}, r"stages\.agent\.lr must be a number > 0, got -1"),
        (
            {"stages": {"retrieval": {"epochs": 2.7}}},
            r"stages\.retrieval\.epochs must be an integer >= 0, got 2\.7",
        ),
        # Tracebacks in a worker at the first validation or when examples were built.
        ({"eval_batch_size": 0}, r"eval_batch_size must be an integer >= 1"),
        ({"valid_queries": 0}, r"valid_queries must be an integer >= 1"),
        ({"agent_replay": -1}, r"agent_replay must be a number >= 0"),
        ({"agent_valid_queries": 0}, r"agent_valid_queries must be an integer >= 1"),  # meant "all"
        # Its letters, or a misspelt field, failed when memorization began.
        ({"tool_fields": ["descripton"]}, r"tool_fields \['descripton'\] are not all tool fields"),
        ({"lora": {"targets": "q_proj", "r": 2.5}}, r"LoRA needs an integer r >= 1"),
        (
            {"engine": "llama.cpp", "engine_endpoint": {"endpoint": "http://h/v1", "model": "m"}},
            "is for engine vllm",
        ),
    ],
)
def test_a_setting_a_later_stage_or_worker_would_trip_on_is_refused_on_the_driver(given, says):
    with pytest.raises(ValueError, match=says):
        ToolGenMethod(**given)


def test_one_tool_field_or_lora_target_named_as_a_string_is_one_name():
    method = ToolGenMethod(tool_fields="description", lora={"targets": "q_proj"})
    assert method.params.tool_fields == ("description",)
    assert method.params.lora_spec().targets == ("q_proj",)


def test_a_stage_fitted_before_the_one_it_starts_from_is_refused_by_name(quickstart_1200, tmp_path):
    from components.training.spec import RunSpec

    run = RunSpec(
        name="early", storage_path=str(tmp_path / "s"), local_dir=str(tmp_path / "l"), num_workers=0
    )
    with pytest.raises(
        ValueError, match="stage 'retrieval' starts from 'memorization'; fit 'memorization' first"
    ):
        ToolGenMethod(lm={**TINY_LM}).fit("retrieval", quickstart_1200, run)


@pytest.fixture(scope="module")
def trained(trained_toolgen):
    """The session's ToolGen (tests/conftest.py), trained once through its four stages."""
    return trained_toolgen


def test_every_stage_is_a_ray_train_run_started_from_the_previous_one(trained):
    method, report, root = trained
    assert list(report["stages"]) == ["warmup", "memorization", "retrieval", "agent"]
    # The scratch LM is built on the driver, then copied into the run storage that workers share.
    previous = str(root / "store" / "inputs" / "toolgen-test-init")
    for stage in method.stages:
        assert report["stages"][stage]["stage_seconds"] > 0 and "valid_score" in report["stages"][stage]
        assert os.path.isdir(root / "store" / f"toolgen-test-{stage}")  # its own Ray Train run
        with open(os.path.join(method.stage_dirs[stage], STAGE_FILE)) as f:
            provenance = json.load(f)
        assert provenance == {"stage": stage, "init_dir": previous}
        previous = method.stage_dirs[stage]
    # 100 tools: chance is 0.01; a 2-layer, 64-wide LM only starts memorising within 6 epochs.
    assert report["stages"]["memorization"]["valid_memorization_acc"] >= 0.03
    agent = report["stages"]["agent"]
    assert (
        agent["vocab_added"] == 100
        and agent["vocab_size"] == report["stages"]["warmup"]["vocab_before"] + 100
    )
    assert agent["perplexity_after"] > 1 and report["stages"]["warmup"]["perplexity_before"] > 1


def test_trained_model_beats_untrained(trained, quickstart_1200):
    method, _, _ = trained
    data = quickstart_1200
    untrained = ToolGenMethod.from_dir(method.stage_dirs["warmup"], TINY_PARAMS)
    untrained.index(data.corpus)  # tool tokens from names only, no ToolGen stage
    queries = data.split_queries("test")
    before = evaluate_retrieval(data.qrels["test"], untrained.retrieve(queries, 10))
    after = evaluate_retrieval(data.qrels["test"], method.retrieve(queries, 10))
    retrieval_only = ToolGenMethod.from_dir(method.stage_dirs["retrieval"], TINY_PARAMS)
    retrieval_only.index(data.corpus)
    stage2 = evaluate_retrieval(data.qrels["test"], retrieval_only.retrieve(queries, 10))
    assert after["ndcg@3"] > before["ndcg@3"] + 0.2, (before["ndcg@3"], after["ndcg@3"])
    assert stage2["ndcg@3"] > before["ndcg@3"] + 0.2, (before["ndcg@3"], stage2["ndcg@3"])


def test_the_constraint_makes_every_output_a_real_tool(trained, quickstart_1200):
    method, _, _ = trained
    queries = dict(list(quickstart_1200.split_queries("test").items())[:40])
    results = method.retrieve(queries, 10)
    assert all(len(r) == 10 and set(r) <= set(quickstart_1200.corpus) for r in results.values())
    constrained = method.generate(queries, 5, constrained=True)
    # (hallucination_rate of constrained outputs is 0 by how they are built; what the search must
    # give is a catalog tool per beam, each tool once, best first.)
    assert all(o.tool in quickstart_1200.corpus for beams in constrained for o in beams)
    assert all(len({o.tool for o in beams}) == len(beams) for beams in constrained)
    assert all(
        [o.score for o in beams] == sorted((o.score for o in beams), reverse=True) for beams in constrained
    )
    free = method.generate(queries, 5, constrained=False)
    assert len(free) == 40 and all(len(b) == method.params.num_beams for b in free)
    # Free decoding may name no tool (a hallucination), but never a tool the catalog lacks.
    assert all(o.tool is None or o.tool in quickstart_1200.corpus for beams in free for o in beams)


def test_the_benchmarks_free_decoding_rows_score_the_tools_named(trained, quickstart_1200):
    # benchmarks/toolgen.py's rows for unconstrained decoding (the hallucination figure): each
    # split read by the benchmark, scored on the real tools the beams name, cut to its deepest k.
    from benchmarks.toolgen import free_rows

    method, _, _ = trained
    rows = free_rows(method, quickstart_1200, "toolgen_free", constrained=False)
    assert [r["split"] for r in rows] == report_splits(quickstart_1200)
    # The test row: free beams of the test queries, the real tools they name cut to the deepest k.
    queries = quickstart_1200.split_queries("test")
    beams = method.generate(queries, 10, constrained=False)
    expected = evaluate_retrieval(quickstart_1200.qrels["test"], outputs_to_results(list(queries), beams, 10))
    expected["hallucination_rate"] = hallucination_rate(beams)
    expected["empty_rate"] = empty_rate(beams)
    assert next(r for r in rows if r["split"] == "test")["metrics"] == expected


def test_checkpoints_are_ranked_by_the_decoding_that_is_served(trained, quickstart_1200):
    # decoding: unconstrained serves free beams; ranking that model's checkpoints by trie-constrained
    # retrieval chose the checkpoint another decoder does best with.
    method, _, _ = trained
    data = quickstart_1200
    # Before any tool stage the LM's free beams write text, which names no tool; the trie's beams
    # can only name tools: the two decoders score the same checkpoint apart.
    stage_dir = method.stage_dirs["warmup"]
    scores = {}
    for decoding in ("constrained", "unconstrained"):
        params = {**TINY_PARAMS, "decoding": decoding}
        task = ToolGenTask(ToolGenMethod(**params).stage_config("retrieval", stage_dir, data))
        scores[decoding] = task.retrieval_metrics(task.build_model().eval())
        served = ToolGenMethod.from_dir(stage_dir, params)
        served.index(data.corpus)
        expected = evaluate_retrieval(
            data.qrels["valid"], served.retrieve(data.split_queries("valid"), 5), (3, 5)
        )
        assert scores[decoding] == pytest.approx({m: expected[m] for m in scores[decoding]}, abs=1e-9), (
            decoding
        )
    assert scores["constrained"] != scores["unconstrained"]  # else the two decoders could not disagree
    # After the retrieval stage free beams name tools: the task's free-decoding score is the served one.
    params = {**TINY_PARAMS, "decoding": "unconstrained"}
    task = ToolGenTask(
        ToolGenMethod(**params).stage_config("retrieval", method.stage_dirs["retrieval"], data)
    )
    free = task.retrieval_metrics(task.build_model().eval())
    served = ToolGenMethod.from_dir(method.stage_dirs["retrieval"], params)
    served.index(data.corpus)
    expected = evaluate_retrieval(
        data.qrels["valid"], served.retrieve(data.split_queries("valid"), 5), (3, 5)
    )
    assert free == pytest.approx({m: expected[m] for m in free}, abs=1e-9) and free["ndcg@3"] > 0.2


def test_candidates_narrow_retrieval(trained, quickstart_1200):
    method, _, _ = trained
    qid, query = next(iter(quickstart_1200.split_queries("test").items()))
    full = method.retrieve({qid: query}, 100)[qid]
    narrowed = method.retrieve({qid: query}, 3, candidates={qid: ["5", "7", "9", "nope"]})[qid]
    assert set(narrowed) == {"5", "7", "9"}
    assert all(narrowed[t] == pytest.approx(full[t], abs=1e-5) for t in narrowed)
    # Candidates narrow the indexed catalog, never widen it: a retired tool keeps its trained token.
    try:
        method.index({t: d for t, d in quickstart_1200.corpus.items() if t != "7"})
        assert set(method.retrieve({qid: query}, 3, candidates={qid: ["5", "7", "9"]})[qid]) == {"5", "9"}
    finally:
        method.index(quickstart_1200.corpus)


def test_save_load_round_trip(trained, quickstart_1200, tmp_path):
    method, _, _ = trained
    method.save(str(tmp_path / "a"))
    files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert not any(f.endswith((".pt", ".pkl", ".bin")) for f in files)
    loaded = load(str(tmp_path / "a"))
    queries = dict(list(quickstart_1200.split_queries("test").items())[:20])
    a, b = method.retrieve(queries, 5), loaded.retrieve(queries, 5)
    assert {q: list(r) for q, r in a.items()} == {q: list(r) for q, r in b.items()}
    assert loaded.report["agent"]["vocab_added"] == 100


def test_a_tool_added_after_training_gets_a_name_token_and_is_retrievable(trained, quickstart_1200):
    method, _, _ = trained
    data = quickstart_1200
    qid = next(iter(data.qrels["test"]))
    twin = next(iter(data.qrels["test"][qid]))
    text = data.corpus[twin]["text"].replace("tool_name:", "tool_name:Fresh ", 1)
    corpus = {**data.corpus, "new-tool": {**data.corpus[twin], "_id": "new-tool", "text": text}}
    table = method._lm.get_input_embeddings().weight.detach().clone()
    try:
        method.index(corpus)
        assert method.added_after_training == ["new-tool"]
        (token,) = method.codebook.codes["new-tool"]
        name = td.tool_names(corpus, ["new-tool"])["new-tool"]
        expected = name_embedding_rows(table, method._tokenizer, [" ".join(name.split(" / "))])[0]
        torch.testing.assert_close(method._lm.get_input_embeddings().weight[token], expected)
        scores = method.retrieve({qid: data.queries[qid]}, len(corpus))[qid]
        assert "new-tool" in scores and len(scores) == len(corpus)
    finally:
        method.index(data.corpus)


def test_a_stage_s_checkpoints_do_not_depend_on_another_stage_s_settings():
    # Every stage hashed all the params: a changed agent learning rate (or agent validation size)
    # made the finished memorization and retrieval checkpoints of the same run unresumable.
    from components.training.resume import settings_fingerprint

    def fingerprints(method: ToolGenMethod) -> dict[str, str]:
        stages = ("warmup", "memorization", "retrieval", "agent")
        return {s: settings_fingerprint(method.stage_config(s, "/init", None)) for s in stages}

    base = fingerprints(ToolGenMethod())
    agent = fingerprints(ToolGenMethod(stages={"agent": {"lr": 5e-5}}, agent_valid_queries=100))
    assert [s for s in base if base[s] != agent[s]] == ["agent"]
    retrieval = fingerprints(ToolGenMethod(stages={"retrieval": {"lr": 1e-4}}))
    assert [s for s in base if base[s] != retrieval[s]] == ["retrieval"]
    shared = fingerprints(ToolGenMethod(num_beams=4))  # read by every stage's validation
    assert all(base[s] != shared[s] for s in base)
