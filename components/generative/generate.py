"""Batched free-text generation from a causal LM: chat prompts, greedy or sampled continuations.

Used where an LM writes text rather than tool codes (the query rewriter of arXiv 2412.03573).
Prompts are left-padded so that every row's continuation starts at the same position; decoding is
greedy (deterministic, for evaluation and serving) or sampled with a seeded generator (several
candidates per prompt, for alignment by retrieval reward).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from components.generative import deadline
from components.generative.text import first_line, fit_request

log = logging.getLogger(__name__)


def chat_prompt(tokenizer: PreTrainedTokenizerBase, system: str, user: str) -> str:
    """The prompt text for one request: the tokenizer's chat template when it has one (instruct
    models such as SmolLM2-Instruct were tuned on it), else plain ``system / request / query:`` lines."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system}\nrequest: {user}\nquery:"


def chat_prompts(
    tokenizer: PreTrainedTokenizerBase, system: str, texts: Sequence[str], max_tokens: int
) -> list[str]:
    """:func:`chat_prompt` of each text in at most ``max_tokens`` tokens: a longer request is cut
    to its end (:func:`components.generative.text.fit_request`), the instruction and the
    assistant cue kept whole. Training and generation both prompt through here, so a fine-tuned
    generator sees a long request at inference as it saw one in training."""

    def tokenize(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def fits(text: str) -> bool:
        return len(tokenize(chat_prompt(tokenizer, system, text))) <= max_tokens

    def detokenize(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    requests = [fit_request(t, fits, tokenize, detokenize) for t in texts]
    cut = sum(r != t for r, t in zip(requests, texts, strict=True))
    if cut:
        log.info("%d of %d requests cut to their end to fit a %d-token prompt", cut, len(texts), max_tokens)
    return [chat_prompt(tokenizer, system, r) for r in requests]


def rewrite_texts(
    lm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    system: str,
    texts: Sequence[str],
    max_new_tokens: int = 24,
    batch_size: int = 32,
    max_prompt_tokens: int = 256,
) -> list[str]:
    """The greedy one-line answer to each text under the ``system`` instruction (a query rewrite);
    an empty answer falls back to the text itself. ``max_prompt_tokens``: the prompt's budget, as
    a fine-tuned generator was trained on (a longer request is cut to its end: :func:`chat_prompts`)."""
    prompts = chat_prompts(tokenizer, system, texts, max_prompt_tokens)
    answers = generate_texts(lm, tokenizer, prompts, max_new_tokens, max_prompt_tokens, batch_size=batch_size)
    return [a[0] or t for a, t in zip(answers, texts, strict=True)]


@torch.inference_mode()
def generate_texts(
    lm: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int = 24,
    max_prompt_tokens: int = 256,
    samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    batch_size: int = 32,
    seed: int = 0,
    finished_only: bool = False,
) -> list[list[str]]:
    """``samples`` continuations of each prompt (first line only, special tokens dropped).

    ``temperature == 0`` decodes greedily (then ``samples`` must be 1); otherwise nucleus sampling
    from a generator seeded per batch, so a call repeats exactly. ``finished_only``: a continuation
    cut by ``max_new_tokens`` before it ended (no end-of-sequence, no line break) comes back as
    ``""``; as a training target it would teach the LM to stop mid-phrase.

    Raises:
        DeadlinePassed: a :func:`components.generative.deadline.deadline` passed during decoding.
    """
    if temperature <= 0 and samples != 1:
        raise ValueError(f"greedy decoding gives one continuation per prompt, asked for {samples}")
    lm.eval()
    device = next(lm.parameters()).device
    # Pad and cut on the left: a prompt longer than max_prompt_tokens (a long conversation for the
    # rewriter) keeps its end, the latest turn and the assistant cue the answer follows, as the
    # training prompts were cut. Cut on the right, the LM continued the middle of the history.
    side, cut = tokenizer.padding_side, tokenizer.truncation_side
    tokenizer.padding_side = tokenizer.truncation_side = "left"
    out: list[list[str]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = list(prompts[start : start + batch_size])
            enc = tokenizer(
                chunk,
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=max_prompt_tokens,
                add_special_tokens=False,  # chat templates carry their own special tokens
            ).to(device)
            kwargs: dict = {"do_sample": False}
            if temperature > 0:
                torch.manual_seed(seed * 100_003 + start)
                kwargs = {"do_sample": True, "temperature": temperature, "top_p": top_p}
            left = deadline.time_left()
            if left is not None:  # stop decoding when the caller stops waiting (see .deadline)
                deadline.check()
                kwargs["max_time"] = left
            ids = lm.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                num_return_sequences=samples,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **kwargs,
            )
            deadline.check()  # cut short by max_time: not an answer
            new = ids[:, enc["input_ids"].shape[1] :]
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            if finished_only:
                capped = ~(new == tokenizer.eos_token_id).any(dim=1) & (new.shape[1] >= max_new_tokens)
                # Ended means a line break after the first line's text: first_line drops leading
                # ones, and a capped "\n<cut text>" passed as finished.
                texts = [
                    "" if c and "\n" not in t.lstrip() else t
                    for c, t in zip(capped.tolist(), texts, strict=True)
                ]
            out += [[first_line(t) for t in texts[i : i + samples]] for i in range(0, len(texts), samples)]
    finally:
        tokenizer.padding_side, tokenizer.truncation_side = side, cut
    return out
