"""Free text generation (the query rewriter's): prompts over the length limit keep their end."""

from __future__ import annotations

import torch
from tiny_lm import TEXTS, tiny_lm

from components.generative.generate import first_line, generate_texts


def continuation(lm, tokenizer, ids: list[int], new: int) -> torch.Tensor:
    """The greedy continuation's token ids of one unpadded prompt."""
    prompt = torch.tensor([ids])
    out = lm.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return out[0, len(ids) :]


def greedy(lm, tokenizer, ids: list[int], new: int) -> str:
    return first_line(tokenizer.decode(continuation(lm, tokenizer, ids, new), skip_special_tokens=True))


def test_a_prompt_over_the_limit_keeps_its_end():
    # A long conversation given to the rewriter: its end holds the latest turn and the assistant
    # cue. Cut on the right (the tokenizer's default), the LM continued the middle of the history.
    lm, tokenizer, _ = tiny_lm(seed=4, tools=False)
    prompt = " ".join(TEXTS * 3)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    limit = 12
    assert len(ids) > 2 * limit
    tail, head = greedy(lm, tokenizer, ids[-limit:], 6), greedy(lm, tokenizer, ids[:limit], 6)
    assert tail != head  # the two cuts give different answers, so the test tells them apart
    side = tokenizer.truncation_side
    assert generate_texts(lm, tokenizer, [prompt], max_new_tokens=6, max_prompt_tokens=limit) == [[tail]]
    assert tokenizer.truncation_side == side  # put back, as the padding side is


def test_finished_only_drops_continuations_cut_at_the_token_cap():
    # Alignment's samples become training targets with an end-of-sequence appended: one cut at
    # max_new_tokens would teach the generator to stop mid-phrase.
    lm, tokenizer, _ = tiny_lm(seed=4, tools=False)
    prompts, cap = TEXTS[:4], 3
    every = generate_texts(lm, tokenizer, prompts, max_new_tokens=cap, batch_size=1)
    side = tokenizer.truncation_side
    kept = generate_texts(lm, tokenizer, prompts, max_new_tokens=cap, batch_size=1, finished_only=True)
    assert tokenizer.truncation_side == side  # put back as it was, as after any call
    cut = 0
    for prompt, answer, kept_answer in zip(prompts, every, kept, strict=True):
        new = continuation(lm, tokenizer, tokenizer(prompt, add_special_tokens=False)["input_ids"], cap)
        ended = tokenizer.eos_token_id in new.tolist() or "\n" in tokenizer.decode(
            new, skip_special_tokens=True
        )
        assert kept_answer == (answer if ended else [""])
        cut += not ended
    assert cut > 0  # the cap cut at least one continuation here, so the test tells the two apart
