"""LoRA adapters on a causal LM, with the tool-token rows trainable, saved and loaded as adapters.

ToolGen (arXiv 2410.03439) fine-tunes the whole LM; on a 135M-8B backbone a low-rank adapter
(Hu et al., arXiv 2106.09685) on the attention and MLP projections gets most of that at a small
fraction of the trainable weights and of the checkpoint size. The new tool-token rows of the
embedding and of the output layer (tied to it or not) must still learn freely, since they start as
mere means of subword rows: peft's ``trainable_token_indices`` trains exactly those rows and stores
them in the adapter.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

# Where a stage output keeps its adapter (beside the merged LM).
ADAPTER_DIR = "adapter"

# Llama-family projection names (SmolLM2, Llama 3, Qwen2.5 all use them).
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSpec:
    """Adapter rank, scale, dropout and the projections it wraps."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    targets: tuple[str, ...] = field(default=LLAMA_TARGETS)

    def __post_init__(self) -> None:
        # r is a matrix size (2.5 failed in the worker building the adapter); the names are whole.
        whole_r = isinstance(self.r, int) and not isinstance(self.r, bool)
        named = bool(self.targets) and all(isinstance(t, str) and t for t in self.targets)
        if not whole_r or self.r < 1 or self.alpha <= 0 or not 0.0 <= self.dropout < 1.0 or not named:
            raise ValueError(
                f"LoRA needs an integer r >= 1, alpha > 0, 0 <= dropout < 1 and module names as "
                f"targets, got {self}"
            )


def lora_spec_from(owner: str, given: dict | None) -> LoraSpec | None:
    """The adapter a ``lora`` config section asks for (None when empty: full fine-tuning), with the
    owner (a method name) in the error for an unknown key."""
    if not given:
        return None
    given = dict(given)
    if "targets" in given:
        # One module named as a string is one target: tuple("q_proj") was its letters.
        targets = given["targets"]
        given["targets"] = (targets,) if isinstance(targets, str) else tuple(targets)
    try:
        return LoraSpec(**given)
    except TypeError as e:
        raise ValueError(f"{owner}: lora: {e}; expected some of r, alpha, dropout, targets") from e


def add_lora(model: PreTrainedModel, spec: LoraSpec, trainable_tokens: Sequence[int] = ()) -> PreTrainedModel:
    """Wrap ``model`` in a LoRA adapter; only the adapter and the ``trainable_tokens`` rows train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.targets),
        trainable_token_indices=token_rows(model, sorted(int(i) for i in trainable_tokens)),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def token_rows(model: PreTrainedModel, ids: list[int]) -> list[int] | dict[str, list[int]] | None:
    """peft's ``trainable_token_indices`` for ``ids``: a list trains the input embedding's rows (and
    the output layer's, when it is tied to them: SmolLM2, Qwen2.5-0.5B); an untied output layer
    (Llama-3-8B, the paper's backbone; Qwen2.5-7B) must be named too, or a tool token's output row,
    which alone sets its retrieval logit, stays at its initial value through training."""
    if not ids:
        return None
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if outputs is None or outputs.weight is inputs.weight:
        return ids
    names = {module: name.rsplit(".", 1)[-1] for name, module in model.named_modules()}
    return {names[inputs]: ids, names[outputs]: ids}


def save_adapter(model: PreTrainedModel, path: str) -> None:
    """Write only the adapter (LoRA matrices and the trained token rows) and its config.

    peft would save the whole resized embedding table (49k x 576 floats for SmolLM2) because the
    vocabulary grew; the trained tool rows are already in the adapter, so the table is left out.
    """
    model.save_pretrained(path, save_embedding_layers=False)


def load_adapter(base: PreTrainedModel, path: str, trainable: bool = False) -> PreTrainedModel:
    """``base`` (already resized to the adapter's vocabulary) with the adapter at ``path`` applied."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, path, is_trainable=trainable)


def is_adapted(model: torch.nn.Module) -> bool:
    """Whether ``model`` is wrapped in a peft adapter."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def save_adapter_beside(model: PreTrainedModel, path: str) -> PreTrainedModel:
    """A stage output's LM: when ``model`` is adapted, its adapter alone goes to ``path/adapter``
    (for serving over one base model) and the merged copy is returned, which the caller saves in
    ``path`` for the next stage, decoding and ``load``; a plain model is returned as it is."""
    if not is_adapted(model):
        return model
    save_adapter(model, os.path.join(path, ADAPTER_DIR))
    return merged_copy(model)


def merged_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A plain LM with the adapter folded into its weights (the trained code rows included); the
    adapted model itself is left as it is, so training can go on."""
    return copy.deepcopy(model).merge_and_unload()
