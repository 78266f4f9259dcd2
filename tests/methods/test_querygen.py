"""Query generation (arXiv 2412.03573): SFT targets, retrieval reward, fusion, an alignment round."""

from __future__ import annotations

import pytest
from conftest import LOCAL_MODE, TINY_LM, write_tiny_dataset

from components import methods
from components.data import open_dataset
from components.methods.querygen.data import reciprocal_rank_fusion, rewrite_reward, sft_pairs
from components.metrics import evaluate_retrieval
from components.training.spec import RunSpec


@pytest.fixture
def tiny(tmp_path):
    return open_dataset(str(write_tiny_dataset(tmp_path / "tiny")))


def test_sft_targets_name_the_relevant_tools_with_their_descriptions(tiny):
    # open_dataset carves valid out of train: the five training queries are in one or the other.
    pairs = dict(sft_pairs(tiny, "train", 3, 3) + sft_pairs(tiny, "valid", 3, 3))
    # q2 needs tools 1 (Fly / search flights) and 2 (Stay / hotel search), in id order.
    assert pairs["find flights to Rome and a hotel there"] == (
        "Fly / search flights: Find flights between; Stay / hotel search: Find hotels in"
    )
    assert pairs["recipes with salmon"] == "Chef / recipes: Recipes using an"
    assert len(pairs) == 5  # one per query (q1, q2, q3, q5, q6)
    capped = dict(sft_pairs(tiny, "train", 1, 3) + sft_pairs(tiny, "valid", 1, 3))
    assert capped["find flights to Rome and a hotel there"] == "Fly / search flights: Find flights between"


def test_reward_ranks_a_rewrite_with_the_relevant_tools_words_above_an_unrelated_one(tiny):
    bm25 = methods.build("bm25")
    bm25.index(tiny.corpus)
    found = bm25.retrieve(
        {"good": "hotel search find hotels in a city", "bad": "recipes using an ingredient"}, 3
    )
    relevant = {"2"}
    assert rewrite_reward(relevant, found["good"], "ndcg@3") == 1.0
    assert rewrite_reward(relevant, found["bad"], "ndcg@3") < 1.0


def test_a_sample_cut_by_the_token_cap_is_never_an_alignment_target(tiny):
    from components.methods.querygen.align import choose_rewrites

    bm25 = methods.build("bm25")
    bm25.index(tiny.corpus)
    queries = {"q3": "recipes with salmon"}  # its own words find Chef (tool 3) first: reward 1
    # "" is a sample the cap cut (generate_texts(finished_only=True)); the other finds no Chef.
    candidates = {"q3": ["", "flights between airports"]}
    pairs, stats = choose_rewrites(queries, candidates, bm25, {"q3": {"3": 1}}, "ndcg@3")
    # Before, "" was searched as the query itself: it tied with it and was kept, an echo.
    assert pairs == [] and stats["kept"] == 0.0
    assert stats["sampled_reward"] == 0.0 and stats["original_reward"] == 1.0
    # A finished sample as good as the query is still kept.
    pairs, _ = choose_rewrites(
        queries, {"q3": ["", "Chef recipes using an ingredient"]}, bm25, {"q3": {"3": 1}}, "ndcg@3"
    )
    assert pairs == [("recipes with salmon", "Chef recipes using an ingredient")]
    # A sample asking in the query's own words ties with it: kept, it taught the generator to echo.
    pairs, _ = choose_rewrites(
        queries,
        {"q3": ["Recipes with  salmon!", "flights between airports"]},
        bm25,
        {"q3": {"3": 1}},
        "ndcg@3",
    )
    assert pairs == []
    # A round whose every sample was cut keeps nothing and still reports the originals.
    pairs, stats = choose_rewrites(queries, {"q3": ["", ""]}, bm25, {"q3": {"3": 1}}, "ndcg@3")
    assert pairs == [] and stats["original_reward"] == 1.0


def test_reciprocal_rank_fusion_adds_one_over_k_plus_rank():
    a = {"q": {"x": 3.0, "y": 2.0}}
    b = {"q": {"y": 9.0, "z": 1.0}}
    fused = reciprocal_rank_fusion([a, b], k=60)["q"]
    assert fused["y"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["x"] == pytest.approx(1 / 61) and fused["z"] == pytest.approx(1 / 62)


def test_bad_settings_fail_on_the_driver():
    with pytest.raises(ValueError, match="fusion"):
        methods.build("querygen", {"fusion": "max"})
    with pytest.raises(ValueError, match="unknown align settings"):
        methods.build("querygen", {"align": {"round": 2}})
    with pytest.raises(ValueError, match="retriever needs one of"):
        methods.build("querygen", {"retriever": {}})
    # Refused on the driver, not after the retriever and SFT stages have trained.
    for given, says in [
        ({"align": {"temperature": 0}}, r"align.temperature 0 decodes greedily, .* align.samples is 4"),
        ({"align": {"epochs": 0}}, r"align.epochs must be >= 1, got 0"),
        ({"align": {"lr": 0}}, r"align.lr must be > 0"),
        ({"sft": {"batch_size": 0}}, r"sft.batch_size must be >= 1"),
        ({"valid_queries": 0}, r"valid_queries must be >= 1 \(or null: all of them\), got 0"),
        ({"sft": {"max_examples": -1}}, r"sft.max_examples must be >= 1"),
        ({"target_tools": 0}, r"target_tools must be >= 1, got 0"),
    ]:
        with pytest.raises(ValueError, match=says):
            methods.build("querygen", given)
    # A stage that does not run is not checked: zero-shot with greedy settings is fine.
    methods.build("querygen", {"align": {"rounds": 0, "temperature": 0}, "sft": {"epochs": 0, "lr": 0}})


class RecordingGenerator:
    """Stands in for the generator LM where only which checkpoint it holds matters."""

    trainable = True

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self, path: str) -> None:
        self.path = path

    def model(self) -> tuple[None, None]:
        return None, None


def test_an_alignment_round_that_retrieves_worse_on_valid_is_undone(tiny, tmp_path, monkeypatch):
    # Each round's checkpoint is chosen on the SFT targets' NLL, which alignment moves away from:
    # the round is kept only if its rewrites retrieve at least as well on valid as before it.
    import components.methods.querygen.method as querygen_method

    method = methods.build("querygen", {"align": {"rounds": 3, "queries": 4}})
    method.gen, method._generator_source = RecordingGenerator("sft-dir"), "sft-uri"
    method.report["sft"] = {"generated_ndcg@3": 0.40, "rrf_ndcg@3": 0.50}  # valid check after SFT
    valid = {"align1": 0.60, "align2": 0.55, "align3": 0.58}  # round 1 helps, 2 and 3 do not
    started: list[str] = []

    def train(stage, pairs, settings, run):
        started.append(method._generator_source)
        method.gen.load(f"{stage}-dir")
        method._generator_source = f"{stage}-uri"
        return {}

    monkeypatch.setattr(method, "best_rewrites", lambda *args: ([("query", "rewrite")], {}))
    monkeypatch.setattr(method, "_train", train)
    monkeypatch.setattr(method, "valid_check", lambda data, stage: {"rrf_ndcg@3": valid[stage]})
    monkeypatch.setattr(querygen_method, "pairs_nll", lambda *args: 0.0)
    out = method._fit_align(tiny, RunSpec(name="qg", storage_path=str(tmp_path)))
    assert [out[f"round{r}_accepted"] for r in (1, 2, 3)] == [1.0, 0.0, 0.0]
    # Round 3 starts from round 1's generator, and the method ends with it.
    assert started == ["sft-uri", "align1-uri", "align1-uri"]
    assert (method.gen.path, method._generator_source) == ("align1-dir", "align1-uri")


@pytest.fixture(scope="module")
def aligned(ray_session, small_quickstart, tmp_path_factory):
    root = tmp_path_factory.mktemp("querygen")
    method = methods.build(
        "querygen",
        {
            "generator": TINY_LM,  # SmolLM2 is the default generator
            "lora": {},  # a scratch LM fine-tunes whole
            "sft": {"epochs": 3, "lr": 3e-3, "batch_size": 16},
            "align": {"rounds": 1, "queries": 80, "samples": 4, "epochs": 2, "lr": 1e-3},
            "valid_queries": 32,
            "max_new_tokens": 16,
        },
    )
    # Every stage in Ray Train's local mode (see LOCAL_MODE in conftest.py): worker actors, which
    # add ~9 s of process start-up here, are tested with the dense stages.
    run = RunSpec(
        name="qg-test", storage_path=str(root / "store"), local_dir=str(root / "local"), **LOCAL_MODE
    )
    report = {stage: method.fit(stage, small_quickstart, run) for stage in method.stages}
    return method, report


def test_an_alignment_round_runs_on_ray_train_and_moves_the_generator_toward_its_best_rewrites(aligned):
    method, report = aligned
    sft, align = report["sft"], report["align"]
    assert sft["valid_target_nll"] > 0 and "stage_seconds" in sft
    # Rejection sampling keeps the best-rewarded sample of each query where it earned a reward ...
    assert 0 < align["round1_kept"] <= 1
    assert align["round1_best_reward"] > align["round1_sampled_reward"]
    # ... and the round's Ray Train run makes exactly those rewrites likelier.
    assert align["round1_chosen_nll_after"] < align["round1_chosen_nll_before"]
    # The fusion that retrieved better in the last stage's valid check (rrf only when strictly better).
    assert method.fusion == ("rrf" if align["rrf_ndcg@3"] > align["generated_ndcg@3"] else "generated")


def test_retrieval_answers_catalog_ids_only_and_survives_save_load(aligned, small_quickstart, tmp_path):
    method, _ = aligned
    queries = small_quickstart.split_queries("test")
    results = method.retrieve(queries, 5)
    assert set(results) == set(queries)
    assert all(set(r) <= set(small_quickstart.corpus) and len(r) <= 5 for r in results.values())
    assert any(results.values())
    method.save(str(tmp_path / "qg"))
    assert not [p for p in (tmp_path / "qg").rglob("*") if p.suffix in (".pt", ".pkl", ".bin")]
    again = methods.load(str(tmp_path / "qg"))
    assert again.fusion == method.fusion
    assert again.rewrite(queries) == method.rewrite(queries)
    assert evaluate_retrieval(
        small_quickstart.qrels["test"], again.retrieve(queries, 5)
    ) == evaluate_retrieval(small_quickstart.qrels["test"], results)

    # A scratch generator has no base model an LLM server could hold: no adapter, one clear line.
    from typer.testing import CliRunner

    from workflows.cli import app

    out = CliRunner().invoke(app, ["export-adapter", str(tmp_path / "qg"), str(tmp_path / "adapter")])
    assert out.exit_code == 1 and "no pretrained LM trained here" in out.output
    assert not (tmp_path / "adapter").exists()


def test_a_tool_added_after_training_is_found_through_the_retriever(aligned, small_quickstart):
    method, _ = aligned
    corpus = dict(small_quickstart.corpus)
    corpus["new"] = {
        "title": "",
        "text": "tool_name:Tidewatch, api_name:tide tables, api_description:Tide tables for a harbour",
        "metadata": {},
    }
    try:
        method.index(corpus)
        found = method.retrieve({"q": "tide tables for the harbour of Brest"}, 3, fusion="rrf")
        assert "new" in found["q"]
    finally:
        method.index(small_quickstart.corpus)


def test_the_rewrite_cache_keeps_the_most_recent_texts_only(aligned, monkeypatch):
    # A serving replica rewrites texts without end: the cache holds the most recently asked.
    import components.methods.querygen.method as querygen_method

    method, _ = aligned
    asked: list[str] = []

    def rewrite(texts: list[str]) -> list[str]:
        asked.extend(texts)
        return [f"rewritten {t}" for t in texts]

    monkeypatch.setattr(querygen_method, "REWRITE_CACHE", 3)
    monkeypatch.setattr(method.gen, "rewrite", rewrite)
    monkeypatch.setattr(method, "_cache", type(method._cache)())
    assert method.rewrite({"1": "a", "2": "b", "3": "a"}) == {
        "1": "rewritten a",
        "2": "rewritten b",
        "3": "rewritten a",
    }
    method.rewrite({"1": "c"})
    method.rewrite({"1": "a"})  # a cache hit, now the most recent
    method.rewrite({"1": "d"})  # evicts b, the least recent
    assert list(method._cache) == ["c", "a", "d"] and asked == ["a", "b", "c", "d"]
    method.rewrite({"1": "b"})
    assert asked[-1] == "b" and len(method._cache) == 3


def test_rewrites_and_samples_cut_the_prompt_where_training_cut_it(aligned, monkeypatch):
    # Training keeps the last query_max_length tokens of the chat prompt; generation must too, or a
    # long request reaches the generator with an instruction it never saw beside such a request.
    import components.generative.generate as generate

    method, _ = aligned
    cuts: list[int] = []
    real = generate.generate_texts

    def recording(lm, tokenizer, prompts, max_new_tokens=24, max_prompt_tokens=256, **kwargs):
        cuts.append(max_prompt_tokens)
        return real(lm, tokenizer, prompts, max_new_tokens, max_prompt_tokens, **kwargs)

    monkeypatch.setattr(generate, "generate_texts", recording)
    monkeypatch.setattr("components.methods.querygen.generator.generate_texts", recording)
    method.gen.rewrite(["find a hotel " * 80])
    method.gen.sample(["find a hotel " * 80], samples=2, temperature=0.8, top_p=0.9, seed=0)
    assert cuts == [method.params.query_max_length] * 2


def test_training_prompts_a_long_query_as_generation_does():
    # The SFT example's prompt is the one rewrite() sends: the instruction whole, the query cut to
    # its end. Before, training kept the chat prompt's last query_max_length tokens, instruction or not.
    from components.generative.generate import chat_prompts
    from components.generative.lm import LMSpec, build_causal_lm
    from components.methods.querygen.params import QueryGenParams
    from components.methods.querygen.task import rewrite_examples

    texts = ["weather forecast for paris", "find flights to rome", "book a hotel near the airport"]
    spec = LMSpec(
        vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_length=64
    )
    _, tokenizer = build_causal_lm(spec, texts)
    params = QueryGenParams(system_prompt="rewrite as a query", query_max_length=120, target_max_length=8)
    long = " ".join(texts * 8)
    (example,) = rewrite_examples(tokenizer, params, [(long, "weather api")])
    (prompt,) = chat_prompts(tokenizer, params.system_prompt, [long], params.query_max_length)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert example.ids[: len(ids)] == ids and len(ids) <= params.query_max_length
    assert prompt.startswith(params.system_prompt) and prompt.endswith("query:")


def test_a_long_sft_target_is_cut_at_a_whole_tool_phrase_not_mid_phrase():
    # Cut at the token, three ToolLens targets in four ended mid-phrase and were then closed with
    # the end of sequence, teaching the generator to stop in the middle of a tool's name.
    from components.generative.lm import LMSpec, build_causal_lm
    from components.methods.querygen.task import whole_target

    target = "weather api: forecast for a city; flight search: find flights; hotel finder: rooms"
    spec = LMSpec(
        vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_length=64
    )
    _, tokenizer = build_causal_lm(spec, [target])

    def size(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    two = "weather api: forecast for a city; flight search: find flights"
    assert tokenizer.decode(whole_target(tokenizer, target, size(target))) == tokenizer.decode(
        tokenizer(target, add_special_tokens=False)["input_ids"]
    )
    for budget in range(size(two), size(target)):
        assert (
            whole_target(tokenizer, target, budget) == tokenizer(two, add_special_tokens=False)["input_ids"]
        )
    # Not even one phrase fits: the last whole word that does.
    short = whole_target(tokenizer, target, size("weather api: forecast"))
    assert short == tokenizer("weather api: forecast", add_special_tokens=False)["input_ids"]


def test_cold_start_and_text_encoders_are_the_wrapped_retrievers():
    # Over ToolGen (a token per trained tool) a new tool is not found by its text: querygen must not
    # claim it can (livemcpbench and serving read the instance's capabilities).
    method = methods.build("querygen", {"retriever": {"method": "toolgen"}})
    method._adopt(methods.build("toolgen", {}))
    assert "cold_start" not in method.capabilities and "text_encoders" not in method.capabilities
    method._adopt(methods.build("dense", {}))
    assert {"cold_start", "text_encoders"} <= method.capabilities
    method._adopt(methods.build("bm25", {}))
    assert "cold_start" in method.capabilities and "text_encoders" not in method.capabilities


def test_the_generator_loads_in_the_precision_its_settings_name(tiny, tmp_path):
    # generator.dtype was accepted and never applied: a bf16 setting loaded float32 weights.
    import torch

    from components.generative.lm import build_causal_lm, lm_spec_from, save_causal_lm
    from components.methods.querygen.generator import LocalGenerator
    from components.methods.querygen.params import QueryGenParams

    lm, tokenizer = build_causal_lm(lm_spec_from(TINY_LM), list(tiny.queries.values()), seed=0)
    save_causal_lm(lm, tokenizer, str(tmp_path / "lm"))
    for dtype, want in ((None, torch.float32), ("bfloat16", torch.bfloat16)):
        generator = LocalGenerator(None, QueryGenParams(generator={**TINY_LM, "dtype": dtype}))
        generator.load(str(tmp_path / "lm"))
        assert next(generator.model()[0].parameters()).dtype == want, dtype


def test_a_bfloat16_generator_exports_its_adapter_against_the_base_in_bfloat16(tiny, tmp_path):
    import torch

    from components.generative.lm import build_causal_lm, lm_spec_from, save_causal_lm
    from components.methods.base import write_config
    from components.methods.querygen.adapter import export_generator_adapter

    lm, tokenizer = build_causal_lm(lm_spec_from(TINY_LM), list(tiny.queries.values()), seed=0)
    save_causal_lm(lm, tokenizer, str(tmp_path / "base"))  # a pretrained base, stored in float32
    tuned = lm.to(torch.bfloat16)  # trained in bfloat16 (generator.dtype): the base's values here
    with torch.no_grad():
        tuned.model.layers[0].self_attn.q_proj.weight[0, :4] += 0.5  # one LoRA target moved
    save_causal_lm(tuned, tokenizer, str(tmp_path / "artifact" / "generator"))
    generator = {"name_or_path": str(tmp_path / "base"), "dtype": "bfloat16"}
    write_config(str(tmp_path / "artifact"), {"method": "querygen", "params": {"generator": generator}})
    report = export_generator_adapter(str(tmp_path / "artifact"), str(tmp_path / "adapter"))
    assert report.rank == 1 and report.max_residual < 1e-3


def test_a_pretrained_generator_named_by_its_directory_is_shared_with_the_workers(tiny, tmp_path):
    # Workers on other nodes cannot read the driver's directory: it goes to the run's storage, as
    # the scratch LM does (a packaged or hub name is read by each node itself, unchanged).
    from components.generative.lm import build_causal_lm, lm_spec_from, save_causal_lm

    lm, tokenizer = build_causal_lm(lm_spec_from(TINY_LM), list(tiny.queries.values()), seed=0)
    save_causal_lm(lm, tokenizer, str(tmp_path / "my-lm"))
    method = methods.build("querygen", {"generator": {"name_or_path": str(tmp_path / "my-lm")}})
    run = RunSpec(name="qg", storage_path=str(tmp_path / "store"), local_dir=str(tmp_path / "local"))
    method._fit_retriever(tiny, run)  # the stage without its valid check (which generates)
    assert method._generator_source == str(tmp_path / "store" / "inputs" / "qg-generator-init")
    assert (tmp_path / "store" / "inputs" / "qg-generator-init" / "config.json").exists()
    packaged = methods.build("querygen", {})
    packaged._fit_retriever(tiny, run)
    assert packaged._generator_source == "smollm2-135m"


def test_a_generator_failing_part_way_keeps_the_rewrites_already_made(monkeypatch):
    # Evaluating 1,877 queries through an endpoint: one 502 near the end lost every rewrite before.
    import components.methods.querygen.method as querygen_method

    method = methods.build("querygen", {})
    asked: list[list[str]] = []

    class Flaky:
        def rewrite(self, texts: list[str]) -> list[str]:
            asked.append(list(texts))
            if len(asked) == 2:
                raise ConnectionError("502 from the endpoint")
            return [f"rewritten {t}" for t in texts]

    monkeypatch.setattr(querygen_method, "REWRITE_CHUNK", 2)
    method.gen = Flaky()
    queries = {str(i): t for i, t in enumerate("abcde")}
    with pytest.raises(ConnectionError):
        method.rewrite(queries)
    assert asked == [["a", "b"], ["c", "d"]]
    assert method.rewrite(queries) == {q: f"rewritten {t}" for q, t in queries.items()}
    assert asked[2:] == [["c", "d"], ["e"]]  # a and b were not asked again
