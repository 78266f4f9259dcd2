"""Free text generation (the query rewriter's): prompts over the length limit keep their end."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import TEXTS, tiny_lm

from components.generative.generate import chat_prompt, chat_prompts, first_line, generate_texts
from components.generative.text import fit_request


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
        # A line break after text: a leading one alone, which first_line drops, ends nothing.
        ended = (
            tokenizer.eos_token_id in new.tolist()
            or "\n" in tokenizer.decode(new, skip_special_tokens=True).lstrip()
        )
        assert kept_answer == (answer if ended else [""])
        cut += not ended
    assert cut > 0  # the cap cut at least one continuation here, so the test tells the two apart


def test_a_long_request_is_cut_to_its_end_and_the_instruction_kept_whole():
    # Cut as one string from the left, a long request's prompt lost its instruction (the in-process
    # generator), while llama.cpp left such a request unrewritten: one request, two treatments.
    _, tokenizer, _ = tiny_lm(seed=4, tools=False)

    def size(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    system, long, budget = "rewrite the request as a search query", " ".join(TEXTS * 3), 80
    assert size(chat_prompt(tokenizer, system, long)) > budget
    (prompt,) = chat_prompts(tokenizer, system, [long], budget)
    request = prompt.removeprefix(f"{system}\nrequest: ").removesuffix("\nquery:")
    assert prompt == chat_prompt(tokenizer, system, request) and size(prompt) <= budget
    assert request and long.endswith(request) and len(request) < len(long)
    # The longest end that fits: one more token of the request would not.
    ids = tokenizer(long, add_special_tokens=False)["input_ids"]
    longer = tokenizer.decode(ids[-(size(request) + 1) :]).strip()
    assert size(chat_prompt(tokenizer, system, longer)) > budget
    # A request that fits is left alone; an instruction that fills the budget is a clear error.
    assert chat_prompts(tokenizer, system, ["weather in paris"], budget) == [
        chat_prompt(tokenizer, system, "weather in paris")
    ]
    with pytest.raises(ValueError, match="system prompt and chat template alone fill"):
        chat_prompts(tokenizer, system * 4, ["weather"], budget)


def test_fit_request_keeps_the_longest_end_that_fits():
    words = ["one", "two", "three", "four", "five", "six", "seven"]

    def fits(text: str) -> bool:
        return len(f"SYSTEM {text}".split()) <= 4

    got = fit_request(" ".join(words), fits, lambda t: t.split(), " ".join)
    assert got == "five six seven"
    assert fit_request("one two", fits, lambda t: t.split(), " ".join) == "one two"
    # Room for the instruction and nothing else: an empty request is no request (it was prompted).
    with pytest.raises(ValueError, match="leaves no room for a request"):
        fit_request("supercalifragilistic", lambda t: len("SYS" + t) <= 3, list, "".join)
