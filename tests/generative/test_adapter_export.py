"""A chain of merged LoRA stages exported as one adapter over the base LM (for adapter multiplexing)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from tiny_lm import tiny_lm

from components.generative import adapter_export
from components.generative.adapter_export import export_adapter
from components.generative.lora import LoraSpec, add_lora, load_adapter

SPEC = LoraSpec(r=4, alpha=8, dropout=0.0)


def lora_stage(lm, seed: int):
    """``lm`` with a rank-4 adapter of random (non-zero) weights merged in: one trained stage."""
    adapted = add_lora(copy.deepcopy(lm), SPEC)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in adapted.modules():
            if hasattr(module, "lora_B") and "default" in module.lora_B:
                b = module.lora_B["default"].weight
                b.copy_(torch.randn(b.shape, generator=generator) * 0.2)
    return adapted.merge_and_unload().eval()


def logits(lm, tokenizer, text: str = "find cheap flights to rome") -> torch.Tensor:
    with torch.no_grad():
        return lm(**tokenizer(text, return_tensors="pt")).logits


@pytest.mark.parametrize("sketch", [False, True], ids=["full_svd", "randomized_svd"])
def test_two_merged_stages_become_one_adapter_over_the_base(tmp_path, monkeypatch, sketch):
    if sketch:  # the tiny LM's projections are 32-64 wide: sketch below that so the fast path runs
        monkeypatch.setattr(adapter_export, "SKETCH_RANK", 16)
    base, tokenizer, _ = tiny_lm(tools=False)
    tuned = lora_stage(lora_stage(base, seed=1), seed=2)  # SFT, then an alignment round
    assert not torch.allclose(logits(tuned, tokenizer), logits(base, tokenizer), atol=1e-3)

    report = export_adapter(base, tuned, SPEC.targets, str(tmp_path / "adapter"))
    assert report.rank == 8  # two rank-4 deltas: one rank-8 adapter holds both exactly
    assert report.modules == 7 and report.max_residual < 1e-4  # 7 projections in the 1 layer
    assert json.loads((tmp_path / "adapter" / "export.json").read_text())["rank"] == 8

    served = load_adapter(copy.deepcopy(base), str(tmp_path / "adapter")).eval()
    torch.testing.assert_close(logits(served, tokenizer), logits(tuned, tokenizer), atol=1e-4, rtol=1e-4)

    # Half the rank cannot hold two stages: refused, not written as a worse model.
    with pytest.raises(ValueError, match="residual"):
        export_adapter(base, tuned, SPEC.targets, str(tmp_path / "small"), rank=4)


def test_weights_an_adapter_cannot_carry_are_refused(tmp_path):
    base, _, _ = tiny_lm(tools=False)
    normed = lora_stage(base, seed=1)
    with torch.no_grad():
        normed.model.norm.weight.add_(0.1)
    with pytest.raises(ValueError, match=r"model\.norm\.weight differs from the base but is not a LoRA"):
        export_adapter(base, normed, SPEC.targets, str(tmp_path / "a"))

    with_tools, _, _ = tiny_lm(tools=True)  # ToolGen's new token rows: the vocabulary grew
    with pytest.raises(ValueError, match="cannot carry new token rows"):
        export_adapter(base, with_tools, SPEC.targets, str(tmp_path / "b"))
