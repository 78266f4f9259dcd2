"""LoRA in the LM stages (ToolGen here; ToolWeaver shares the stages): only the adapter and the
code-token rows train, each stage saves its adapter beside the merged LM, and the adapter applied
to the previous stage's LM is exactly the merged one."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import LOCAL_MODE
from test_toolgen import TINY_PARAMS

from components.generative.bundle import load_bundle
from components.generative.lora import ADAPTER_DIR, load_adapter
from components.methods.toolgen.method import ToolGenMethod
from components.training.spec import RunSpec
from workflows.train import fit_method

# The plain-text warm-up is skipped (test_toolgen.py trains it): the adapter is checked on the two
# stages that learn tool tokens.
LORA_STAGES = {
    "warmup": {"epochs": 0},
    "memorization": {"epochs": 1, "batch_size": 16, "lr": 5.0e-3},
    "retrieval": {"epochs": 1, "batch_size": 16, "lr": 5.0e-3},
    "agent": {"epochs": 0},
}


@pytest.fixture(scope="module")
def adapted(ray_session, quickstart_1200, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    params = {**TINY_PARAMS, "stages": LORA_STAGES, "lora": {"r": 4, "alpha": 8}, "perplexity_texts": 0}
    method = ToolGenMethod(**params)
    run = RunSpec(
        name="lora-test", storage_path=str(root / "store"), local_dir=str(root / "local"), **LOCAL_MODE
    )
    return method, fit_method(method, quickstart_1200, run)


def test_only_the_adapter_and_the_tool_rows_train(adapted):
    method, report = adapted
    retrieval = report["stages"]["retrieval"]
    # 2 layers x 7 projections at r = 4 plus 100 tool rows, of a ~0.2M-parameter LM.
    assert 0 < retrieval["valid_trainable_fraction"] < 0.3, retrieval
    # What the retrieval stage changed, merged LM against the one it started from: the tool-token
    # rows and the adapted projections; every other embedding row and every norm stays as it was.
    before, _, codebook = load_bundle(method.stage_dirs["memorization"])
    after, _, _ = load_bundle(method.stage_dirs["retrieval"])
    rows = torch.tensor(sorted({i for code in codebook.codes.values() for i in code}))
    emb_before, emb_after = before.get_input_embeddings().weight, after.get_input_embeddings().weight
    others = torch.ones(len(emb_before), dtype=torch.bool)
    others[rows] = False
    assert torch.equal(emb_after[others], emb_before[others])
    assert not torch.equal(emb_after[rows], emb_before[rows])
    start = dict(before.named_parameters())
    changed = {n for n, p in after.named_parameters() if not torch.equal(p, start[n])}
    assert not {n for n in changed if "norm" in n}
    assert any("q_proj" in n for n in changed) and any("down_proj" in n for n in changed)


def test_each_stage_saves_its_adapter_and_it_rebuilds_the_merged_lm(adapted):
    method, _ = adapted
    stage_dir = method.stage_dirs["retrieval"]
    assert os.path.exists(os.path.join(stage_dir, ADAPTER_DIR, "adapter_config.json"))
    merged, tokenizer, codebook = load_bundle(stage_dir)
    base, _, _ = load_bundle(method.stage_dirs["memorization"])  # the stage's starting LM
    ids = tokenizer(["find me a flight to rome"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        before = base.eval()(input_ids=ids).logits[0, -1]
        # (peft injects the adapter into ``base`` itself: its logits are read first.)
        rebuilt = load_adapter(base, os.path.join(stage_dir, ADAPTER_DIR)).eval()
        expected = merged.eval()(input_ids=ids).logits[0, -1]
        got = rebuilt(input_ids=ids).logits[0, -1]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    # The adapter changed the LM: the merged LM is not the starting one.
    assert not torch.allclose(before, expected, atol=1e-3)
    assert len(codebook) == 100


def test_an_adapted_model_still_names_only_catalog_tools(adapted, quickstart_1200):
    method, _ = adapted
    queries = quickstart_1200.split_queries("test")
    named = [t for ranked in method.retrieve(queries, 5).values() for t in ranked]
    assert named and set(named) <= set(quickstart_1200.corpus)


def test_a_bad_lora_setting_fails_on_the_driver():
    with pytest.raises(ValueError, match="lora"):
        ToolGenMethod(**{**TINY_PARAMS, "lora": {"rank": 4}})
    with pytest.raises(ValueError, match="LoRA needs an integer r >= 1"):
        ToolGenMethod(**{**TINY_PARAMS, "lora": {"r": 0}})
