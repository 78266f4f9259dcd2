"""Trie-constrained beam search: exact on small tries, the one-step shortcut, narrowing, HF agreement."""

from __future__ import annotations

import itertools

import pytest
import torch
from tiny_lm import NAMES, tiny_lm

from components.generative.constrained import constrained_top_k, single_step_top_k, trie_beam_search
from components.generative.hallucination import OutputParser, generate_outputs, hits_to_outputs
from components.generative.targeted import TargetedLM
from components.generative.tool_tokens import ToolCodebook
from components.generative.trie import TokenTrie


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(seed=1)


def prompts_of(tokenizer):
    texts = ["weather in paris", "flights to rome please", "a hotel", "salmon dinner with rice tonight"]
    return [tokenizer(t)["input_ids"] for t in texts]


@torch.no_grad()
def exact_score(model, prompt, code, end=None):
    """log p(code [+ end] | prompt) by one teacher-forced pass (brute force)."""
    seq = [*prompt, *code, *([end] if end is not None else [])]
    logp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].float(), -1)
    return sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(seq[len(prompt) :]))


def test_shortcut_equals_beam_search_for_single_token_codes(lm):
    model, tokenizer, codebook = lm
    prompts = prompts_of(tokenizer)
    wrapped = TargetedLM(model)
    fast = single_step_top_k(wrapped, prompts, codebook.trie(), 3, tokenizer.pad_token_id)
    for beams in (3, 4, 8):
        slow = trie_beam_search(wrapped, prompts, codebook.trie(), 3, tokenizer.pad_token_id, num_beams=beams)
        assert [[t for t, _ in h] for h in fast] == [[t for t, _ in h] for h in slow]
        for a, b in zip(fast, slow, strict=True):
            assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-5)
    # The scores are the exact log-probabilities of each tool token.
    for prompt, hits in zip(prompts, fast, strict=True):
        assert len({t for t, _ in hits}) == 3
        for tool, score in hits:
            assert score == pytest.approx(exact_score(model, prompt, codebook.codes[tool]), abs=1e-4)
    assert constrained_top_k(wrapped, prompts, codebook.trie(), 3, tokenizer.pad_token_id) == fast


def test_tied_tools_are_the_same_in_the_shortcut_and_the_beam_search():
    # Tools whose rows are identical (cold-start tools of one name) tie exactly: the shortcut took
    # them in topk's order, beam search by tool id, and the two returned different tools.
    model, tokenizer, codebook = tiny_lm(seed=1)  # its own: the rows are overwritten
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        first = min(c[0] for c in codebook.codes.values())
        for code in codebook.codes.values():
            head[code[0]] = head[first]
    prompts = prompts_of(tokenizer)
    wrapped = TargetedLM(model)
    for k in (1, 3, 5):
        fast = single_step_top_k(wrapped, prompts, codebook.trie(), k, tokenizer.pad_token_id)
        slow = trie_beam_search(
            wrapped, prompts, codebook.trie(), k, tokenizer.pad_token_id, num_beams=len(codebook)
        )
        assert [[t for t, _ in h] for h in fast] == [[t for t, _ in h] for h in slow]
        assert all([t for t, _ in h] == sorted(codebook.codes)[:k] for h in fast)


def test_multi_token_beam_search_is_exact_when_beams_cover_the_trie(lm):
    model, tokenizer, _ = lm
    base = len(tokenizer) - len(NAMES)
    # ToolWeaver-style codes: 2-3 tokens, shared prefixes, one code that is a prefix of another.
    codes = {"a": [5, 6], "b": [5, 7], "c": [8, 6, 9], "d": [8, 6, 10], "e": [base], "f": [8]}
    trie = ToolCodebook(codes).trie()
    end = tokenizer.eos_token_id
    wrapped = TargetedLM(model)
    prompts = prompts_of(tokenizer)
    hits = trie_beam_search(
        wrapped, prompts, trie, len(codes), tokenizer.pad_token_id, num_beams=8, end_token=end
    )
    for prompt, got in zip(prompts, hits, strict=True):
        # "f" = [8] is complete but "c"/"d" continue it: it ends with the end token's probability.
        brute = {t: exact_score(model, prompt, c, end if t == "f" else None) for t, c in codes.items()}
        assert [t for t, _ in got] == sorted(brute, key=lambda t: -brute[t])
        assert [s for _, s in got] == pytest.approx(sorted(brute.values(), reverse=True), abs=1e-4)
    # A narrow beam still returns k distinct real tools, best first.
    top2 = trie_beam_search(wrapped, prompts, trie, 2, tokenizer.pad_token_id, num_beams=2, end_token=end)
    for got in top2:
        assert len(got) == 2 and len({t for t, _ in got}) == 2 and got[0][1] >= got[1][1]
    assert constrained_top_k(wrapped, prompts, trie, 2, tokenizer.pad_token_id, 2, end) == top2


def test_candidate_sets_narrow_the_constraint_per_prompt(lm):
    model, tokenizer, codebook = lm
    prompts = prompts_of(tokenizer)
    wrapped = TargetedLM(model)
    full = dict(single_step_top_k(wrapped, prompts[:1], codebook.trie(), 4, tokenizer.pad_token_id)[0])
    sets = [["2", "3"], ["0"], [], ["1", "2", "3"]]
    got = constrained_top_k(wrapped, prompts, [codebook.trie(s) for s in sets], 2, tokenizer.pad_token_id)
    for allowed, hits in zip(sets, got, strict=True):
        assert {t for t, _ in hits} <= set(allowed) and len(hits) == min(2, len(allowed))
    for tool, score in got[0]:
        assert score == pytest.approx(full[tool], abs=1e-5)  # narrowing keeps each tool's own score
    # Asking for no tools answers none per prompt (it was an IndexError from the top-k).
    assert constrained_top_k(wrapped, prompts, codebook.trie(), 0, tokenizer.pad_token_id) == [[]] * 4


def test_constrained_outputs_only_name_real_tools_each_once(lm):
    model, tokenizer, codebook = lm
    prompts = prompts_of(tokenizer)
    hits = constrained_top_k(TargetedLM(model), prompts, codebook.trie(), len(NAMES), tokenizer.pad_token_id)
    for outputs in hits_to_outputs(hits, codebook):
        assert all(o.tool is not None and o.tokens == list(codebook.codes[o.tool]) for o in outputs)
        assert {o.tool for o in outputs} == set(NAMES)  # 4 beams over 4 tools: each exactly once
    # Free decoding's best beam is the constrained best whenever it names a real tool.
    # Free decoding's best beam is the constrained best whenever it names a real tool. An untrained
    # LM seldom names one, so a copy whose tool-token rows are scaled up names one first everywhere
    # (the prompts hold no tool token: only the output side changes).
    import copy

    eager = copy.deepcopy(model)
    with torch.no_grad():
        rows = [code[0] for code in codebook.codes.values()]
        eager.get_output_embeddings().weight[rows] *= 50
    hits = constrained_top_k(TargetedLM(eager), prompts, codebook.trie(), 1, tokenizer.pad_token_id)
    parser = OutputParser(codebook, tokenizer, NAMES)
    free = generate_outputs(eager, tokenizer, prompts, parser, 1, 1)  # one token: a whole code
    assert all(beams[0].tool is not None and len(beams[0].tokens) == 1 for beams in free)
    assert [beams[0].tool for beams in free] == [best[0][0] for best in hits]


def test_trie_depth_and_children():
    trie = TokenTrie([([1], "a"), ([1, 2], "b"), ([3, 4, 5], "c")])
    assert trie.depth == 3 and trie.has_children([1]) and not trie.has_children([1, 2])
    assert list(itertools.chain(*(k for k, _ in trie.items()))) == [1, 1, 2, 3, 4, 5]


class _TwoLevelScorer:
    """Next-token log-probabilities of a fixed two-level code space: after the prompt (token 0),
    code A (token 1) is likelier than B (token 2), but A's five children share its mass while B's
    one child is sure, so B8 is the likeliest full code (0.4 x 0.9 against 0.5 x 0.1)."""

    def next_logprobs(self, seqs, wanted=None):
        out = torch.full((len(seqs), 20), -30.0)
        for row, seq in enumerate(seqs):
            if seq[-1] == 0:
                out[row, 1], out[row, 2] = torch.tensor([0.5, 0.4]).log()
            elif seq[-1] == 1:
                out[row, 3:8] = torch.tensor(0.1).log()
            elif seq[-1] == 2:
                out[row, 8] = torch.tensor(0.9).log()
        return out


def test_validation_ranks_checkpoints_with_the_decoder_retrieval_uses():
    # The stage's validation (memorization accuracy, here) took a top-1 with one beam, greedy:
    # A's likelier first token won, and a model whose retrieval answers B8 scored 0 on B8.
    from types import SimpleNamespace

    from components.generative.params import CodeLMParams
    from components.generative.task import CodeLMTask

    trie = TokenTrie([((1, t), f"A{t}") for t in range(3, 8)] + [((2, 8), "B8")])
    task = SimpleNamespace(
        params=CodeLMParams(),  # 10 beams, as retrieval decodes
        data=SimpleNamespace(corpus={"B8": {"_id": "B8", "title": "", "text": "b", "metadata": {}}}),
        tools=["B8"],
        prompter=SimpleNamespace(memorization=lambda document, max_length: [0]),
        codebook=SimpleNamespace(trie=lambda tools: trie),
        tokenizer=SimpleNamespace(eos_token_id=None),
        pad_id=0,
    )
    task.top_k = lambda model, prompts, k: CodeLMTask.top_k(task, model, prompts, k)
    assert constrained_top_k(_TwoLevelScorer(), [[0]], trie, 1, 0, num_beams=10)[0][0][0] == "B8"
    assert CodeLMTask.memorization_accuracy(task, _TwoLevelScorer()) == 1.0
