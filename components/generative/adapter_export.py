"""One LoRA adapter over the base LM for a model fine-tuned by a chain of LoRA stages, for serving.

A method that trains its LM in several LoRA stages (query generation: SFT, then each alignment
round) merges every stage's adapter into the weights before the next stage adds a fresh one
(:func:`components.generative.lora.save_adapter_beside`), so the last stage's adapter is a delta over
the previous stage's LM, not over the base model. An LLM server that multiplexes adapters over one
base model (Ray Serve LLM / vLLM, arXiv 2106.09685's deployment story) needs the whole delta as
one adapter over the base.

The delta of every adapted projection is a sum of low-rank products, so its rank is at most the sum
of the stages' ranks: a truncated SVD of (tuned - base) at its numerical rank is that delta as one
adapter, exact up to float error (``max_residual`` says how exact). Any other weight that differs
from the base (new tool-token rows, a norm that trained) cannot ride in such an adapter; that is an
error, not a silent loss.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel

# A singular value below this share of its module's largest is float noise of the merges, not rank.
RANK_TOLERANCE = 1e-5
# Above this relative residual the adapter would not be the tuned model: refuse to write it.
MAX_RESIDUAL = 1e-3


@dataclass(frozen=True)
class AdapterExport:
    """What :func:`export_adapter` wrote: the adapter's rank, how many projections it adapts, and
    the largest relative Frobenius residual ||D - BA|| / ||D|| over them."""

    rank: int
    modules: int
    max_residual: float


# Rank a first, randomized SVD looks for: stage adapters are rank 8-32, so the delta of a few
# stages fits; a delta of higher rank falls back to the full SVD.
SKETCH_RANK = 64


def _svd(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, S, V) of ``delta``, through a randomized range finder when the delta's rank is below
    :data:`SKETCH_RANK` (exact then, up to float error, and ~20x faster than the full SVD of a
    1536 x 576 projection on 2 cores), else the full SVD."""
    full = min(delta.shape)
    if full > SKETCH_RANK:
        u, s, v = torch.svd_lowrank(delta, q=SKETCH_RANK, niter=1)
        if s[-1] <= RANK_TOLERANCE * s[0]:
            return u, s, v
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    return u, s, vh.T


def _numerical_rank(s: torch.Tensor) -> int:
    return int((s > RANK_TOLERANCE * s[0]).sum()) if s.numel() and s[0] > 0 else 0


def _target_of(name: str, targets: Sequence[str]) -> bool:
    return name.endswith(".weight") and name.rsplit(".", 2)[-2] in targets


def export_adapter(
    base: PreTrainedModel,
    tuned: PreTrainedModel,
    targets: Sequence[str],
    out_dir: str,
    rank: int | None = None,
) -> AdapterExport:
    """Write the peft LoRA adapter that turns ``base`` into ``tuned`` to ``out_dir``.

    Args:
        base: The LM the server holds (e.g. SmolLM2 as shipped).
        tuned: The fine-tuned LM (every stage's adapter merged in).
        targets: Projection names the stages adapted (``q_proj`` ...).
        rank: The adapter's rank; None takes the largest numerical rank of the deltas.

    Raises:
        ValueError: the two LMs differ in shape, or in a weight outside ``targets``, or the
            adapter would not reproduce ``tuned`` (residual above :data:`MAX_RESIDUAL`).
    """
    from peft import LoraConfig, get_peft_model

    base_sd, tuned_sd = base.state_dict(), tuned.state_dict()
    if base_sd.keys() != tuned_sd.keys():
        raise ValueError("the tuned LM's weights are not the base's: different parameter names")
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    deltas: dict[str, torch.Tensor] = {}
    svds: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for name, weight in tuned_sd.items():
        if weight.shape != base_sd[name].shape:
            raise ValueError(
                f"{name}: shape {tuple(weight.shape)} vs the base's {tuple(base_sd[name].shape)} (the "
                "vocabulary grew?): a LoRA adapter cannot carry new token rows; serve the merged LM"
            )
        if _target_of(name, targets):
            deltas[name] = (weight - base_sd[name]).float()
            svds[name] = _svd(deltas[name])
        elif not torch.equal(weight, base_sd[name]):
            raise ValueError(f"{name} differs from the base but is not a LoRA target {list(targets)}")
    if not deltas:
        raise ValueError(f"no weight of the LM is one of the targets {list(targets)}")
    if rank is None:
        rank = max(1, max(_numerical_rank(s) for _, s, _ in svds.values()))
    residual = 0.0
    for name, delta in deltas.items():
        # The best rank-k fit, the singular values split evenly between the two factors.
        u, s, v = svds[name]
        k = min(rank, s.numel())
        root = s[:k].sqrt()
        b, a = u[:, :k] * root, root[:, None] * v[:, :k].T
        norm = float(delta.norm())
        if norm > 0:
            residual = max(residual, float((delta - b @ a).norm()) / norm)
        pad = rank - a.shape[0]  # a module whose delta has fewer singular values than the rank
        factors[name] = (
            torch.nn.functional.pad(b, (0, pad)).float(),
            torch.nn.functional.pad(a, (0, 0, 0, pad)).float(),
        )
    if residual > MAX_RESIDUAL:
        raise ValueError(f"a rank-{rank} adapter leaves a relative residual of {residual:.2e}: raise rank")

    # lora_alpha = r: peft's scale alpha / r is 1, so the stored factors are the delta itself.
    config = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=list(targets))
    adapted = get_peft_model(copy.deepcopy(base), config)
    filled = 0
    with torch.no_grad():
        for module_name, module in adapted.named_modules():
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            b, a = factors[module_name.removeprefix("base_model.model.") + ".weight"]
            module.lora_A["default"].weight.copy_(a)
            module.lora_B["default"].weight.copy_(b)
            filled += 1
    if filled != len(factors):
        raise ValueError(f"peft adapted {filled} projections, the deltas name {len(factors)}")
    adapted.save_pretrained(out_dir, save_embedding_layers=False)
    report = AdapterExport(rank=rank, modules=filled, max_residual=residual)
    with open(os.path.join(out_dir, "export.json"), "w") as f:
        json.dump(asdict(report), f, indent=1)
    return report
