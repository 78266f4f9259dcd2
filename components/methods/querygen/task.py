"""One generator stage inside a Ray Train worker: fine-tune the rewriter on (query, rewrite) pairs.

Supervised fine-tuning (targets from the relevant tools) and every rejection-sampling round of
alignment (targets: the best-rewarded sampled rewrites) are the same task on different pairs
(arXiv 2412.03573, Sec. 3.2-3.3). The loss is the usual SFT loss over the rewrite's tokens only;
validation is the mean per-token NLL of the valid pairs' targets (the retrieval check runs on the
driver, where the retriever is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ray
import torch
from transformers import PreTrainedTokenizerBase

from components.data import io
from components.generative.generate import chat_prompts
from components.generative.lm import lm_spec_from, load_causal_lm, save_causal_lm
from components.generative.lora import add_lora, save_adapter_beside
from components.generative.targeted import LMExample, TargetedLM, collate_examples, targets_loss
from components.methods.querygen.data import RewritePairs
from components.methods.querygen.params import QueryGenParams
from components.training.task import StageTask

if TYPE_CHECKING:
    from components.training.spec import StageConfig


def rewrite_examples(
    tokenizer: PreTrainedTokenizerBase, params: QueryGenParams, pairs: list[tuple[str, str]]
) -> list[LMExample]:
    """Prompt (chat template + query, in ``query_max_length`` tokens: a long query is cut to its end,
    the instruction kept whole, as generation prompts it) -> rewrite + end of sequence (cut to
    ``target_max_length``)."""
    prompts = chat_prompts(tokenizer, params.system_prompt, [q for q, _ in pairs], params.query_max_length)
    out = []
    for prompt, (_, target) in zip(prompts, pairs, strict=True):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        output = whole_target(tokenizer, target, params.target_max_length)
        out.append(LMExample.continuation(ids, [*output, tokenizer.eos_token_id]))
    return out


def whole_target(tokenizer: PreTrainedTokenizerBase, target: str, budget: int) -> list[int]:
    """``target``'s tokens, cut to ``budget`` at its last tool phrase (``; ``) that fits, else its
    last word that does. Cut at the token, three targets in four on ToolLens ended mid-phrase
    (up to 129 tokens against 48) and were then closed with the end of sequence: the generator
    learnt to stop in the middle of a tool's name."""
    ids = tokenizer(target, add_special_tokens=False)["input_ids"]
    if len(ids) <= budget:
        return ids
    for sep in ("; ", " "):
        cut = target.rfind(sep)
        while cut > 0:
            ids = tokenizer(target[:cut], add_special_tokens=False)["input_ids"]
            if len(ids) <= budget:
                return ids
            cut = target.rfind(sep, 0, cut)
    return tokenizer(target, add_special_tokens=False)["input_ids"][:budget]  # one word over budget


@torch.no_grad()
def mean_target_nll(model: TargetedLM, examples: list[LMExample], pad_id: int, batch_size: int = 32) -> float:
    """Mean negative log-likelihood per target token of ``examples`` under ``model``."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        batch = {k: v.to(device) for k, v in collate_examples(examples[i : i + batch_size], pad_id).items()}
        n = int(batch["tokens"].numel())
        total += float(targets_loss(model, batch)) * n
        count += n
    return total / max(count, 1)


class RewriteTask(StageTask):
    """SFT of the query generator on ``config.inputs.dataset`` (a :class:`RewritePairs`)."""

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.params: QueryGenParams = config.params
        pairs = config.inputs.dataset
        self.pairs: RewritePairs = ray.get(pairs) if isinstance(pairs, ray.ObjectRef) else pairs
        if not self.pairs.train:
            raise ValueError(f"querygen {config.stage}: no training pairs")

    def build_model(self) -> TargetedLM:
        assert self.config.inputs.init_dir is not None, "a generator stage starts from a saved LM"
        source = io.fetch(self.config.inputs.init_dir, self.config.storage_options)
        lm, self.tokenizer = load_causal_lm(source, lm_spec_from(self.params.generator).dtype)
        spec = self.params.lora_spec()
        if spec is not None:
            lm = add_lora(lm, spec)
        self.train_examples = rewrite_examples(self.tokenizer, self.params, self.pairs.train)
        self.valid_examples = rewrite_examples(self.tokenizer, self.params, self.pairs.valid)
        return TargetedLM(lm)

    def train_data(self) -> list[LMExample]:
        return self.train_examples

    def collate(self, items: list[LMExample]) -> dict[str, torch.Tensor]:
        return collate_examples(items, self.tokenizer.pad_token_id)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return targets_loss(model, batch)

    def validate(self, model: torch.nn.Module) -> dict[str, float]:
        """Mean NLL per target token of the valid pairs; ``score`` (higher is better) is its negative."""
        nll = mean_target_nll(
            model, self.valid_examples, self.tokenizer.pad_token_id, self.params.eval_batch_size
        )
        return {"target_nll": nll, "score": -nll}

    def save_model(self, model: torch.nn.Module, path: str) -> None:
        save_causal_lm(save_adapter_beside(model.lm, path), self.tokenizer, path)


def pairs_nll(
    lm: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    params: QueryGenParams,
    pairs: list[tuple[str, str]],
) -> float:
    """Mean per-token NLL of the rewrites in ``pairs`` given their queries, under ``lm``."""
    examples = rewrite_examples(tokenizer, params, pairs)
    return mean_target_nll(TargetedLM(lm), examples, tokenizer.pad_token_id, params.eval_batch_size)
