"""The runner's memory settings: gradient accumulation, gradient checkpointing and FSDP.

Each must change how memory is spent, never what is learned: accumulated half batches step like
one full batch, recomputed activations give the same gradients, and two FSDP workers train a
model as well as one worker does.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import TINY_ENCODER

from components.encoders.text_encoder import EncoderSpec, TextEncoder
from components.training.loop import run_epoch
from components.training.parallel import enable_gradient_checkpointing
from components.training.spec import StageConfig, StageInputs
from components.training.task import StageTask


class _Regression(StageTask):
    """Least squares on a linear model: the mean loss of two half batches is that of the whole."""

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def validate(self, model: torch.nn.Module) -> dict[str, float]:
        return {}


def config(**changes) -> StageConfig:
    base = StageConfig(
        task="tests:unused",
        stage="regression",
        params=None,
        inputs=StageInputs(dataset=None),
        epochs=1,
        lr=0.05,
        batch_size=8,
    )
    return replace(base, **changes)


def train(batches: list, accumulate: int, clip: float = 1.0) -> tuple[torch.nn.Module, int]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    settings = config(grad_accumulation=accumulate, max_grad_norm=clip)
    run_epoch(_Regression(), model, optimizer, batches, settings, 0, False)
    return model, len(steps)


def test_accumulated_half_batches_step_like_one_full_batch():
    torch.manual_seed(1)
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    full = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
    halves = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 32, 4)]
    one, one_steps = train(full, accumulate=1)
    two, two_steps = train(halves, accumulate=2)
    assert one_steps == two_steps == 4
    for a, b in zip(one.parameters(), two.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    # Without accumulation the half batches take 8 smaller steps: another model.
    eight, eight_steps = train(halves, accumulate=1)
    assert eight_steps == 8 and not torch.allclose(eight.weight, one.weight)


def test_an_epoch_that_ends_mid_accumulation_still_steps():
    torch.manual_seed(1)
    x, y = torch.randn(12, 3), torch.randn(12, 1)
    quarters = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 12, 4)]
    ended, steps = train(quarters, accumulate=2, clip=1e9)
    assert steps == 2  # after batches 2 and 3
    # The lone last batch is its step's whole gradient, as unaccumulated: not half of it (no
    # clipping here, which would scale both steps to one norm and hide it).
    pairs, _ = train([(x[:8], y[:8]), (x[8:], y[8:])], accumulate=1, clip=1e9)
    for a, b in zip(ended.parameters(), pairs.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def gradients(encoder: TextEncoder, checkpointing: bool) -> list[torch.Tensor]:
    if checkpointing:
        enable_gradient_checkpointing(encoder)
    encoder.train()
    tokens = encoder.tokenize(["find a flight to rome", "weather in paris tomorrow"], 16)
    torch.manual_seed(3)  # the same dropout masks in both runs
    encoder(tokens["input_ids"], tokens["attention_mask"]).pow(2).sum().backward()
    return [p.grad.clone() for p in encoder.parameters() if p.grad is not None]


def checkpointing(encoder: TextEncoder) -> bool:
    backbone = encoder.backbone
    return bool(getattr(backbone, "is_activation_checkpointing", None) or backbone.is_gradient_checkpointing)


def test_gradient_checkpointing_gives_the_same_gradients():
    texts = ["find a flight to rome", "weather in paris tomorrow"]
    spec = EncoderSpec(**TINY_ENCODER)
    plain = TextEncoder.from_spec(spec, texts, seed=0)
    recomputed = TextEncoder.from_spec(spec, texts, seed=0)
    expected = gradients(plain, checkpointing=False)
    got = gradients(recomputed, checkpointing=True)
    assert checkpointing(recomputed) and not checkpointing(plain)
    assert len(got) == len(expected) > 0
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(a, b)


def test_gradient_checkpointing_on_a_model_without_support_is_a_clear_error():
    with pytest.raises(ValueError, match="gradient_checkpointing: Linear holds no model"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


def test_bad_memory_settings_are_refused():
    with pytest.raises(ValueError, match="parallel_strategy 'zero3'"):
        config(parallel_strategy="zero3")
    with pytest.raises(ValueError, match="grad_accumulation must be >= 1"):
        config(grad_accumulation=0)
