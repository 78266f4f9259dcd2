"""LoRA with trainable tool-token rows (components/generative/lora.py): the rows that score a tool
train in the input embedding and in the output layer, tied to it or not, and survive the adapter's
save and load."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import tiny_lm

from components.generative.lora import LoraSpec, add_lora, load_adapter, merged_copy, save_adapter


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_tool_tokens_output_row_trains_and_is_kept_by_the_adapter(tied, tmp_path):
    base, _, codebook = tiny_lm(tied=tied)
    tools = sorted(token for code in codebook.codes.values() for token in code)  # the new tokens' ids
    start = base.lm_head.weight.detach().clone()
    model = add_lora(base, LoraSpec(r=2), tools)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    prompt = torch.tensor([[1, 2, 3]])
    loss = -torch.log_softmax(model(input_ids=prompt).logits[0, -1], -1)[tools[0]]
    loss.backward()
    optimizer.step()
    merged = merged_copy(model)
    # The tool's output row moved (untied: it stayed at its start before the fix); others did not.
    assert (merged.lm_head.weight[tools[0]] - start[tools[0]]).abs().max() > 1e-3
    assert torch.equal(merged.lm_head.weight[: tools[0]], start[: tools[0]])
    save_adapter(model, str(tmp_path / "adapter"))
    reloaded = load_adapter(tiny_lm(tied=tied)[0], str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=prompt).logits, model.eval()(input_ids=prompt).logits)
