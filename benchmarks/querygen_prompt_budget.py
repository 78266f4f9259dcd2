"""How many requests pass query generation's prompt budget, and what the cut keeps.

Query generation (arXiv 2412.03573) prompts its generator with a system instruction and the
request in the generator's chat template, in at most ``query_max_length`` tokens. A prompt over the
budget has its request cut to its end, the instruction kept whole (``chat_prompts``); before, the
whole prompt was cut from the left and lost the instruction. This counts, per split, the requests
whose prompt passes the budget (the ones either rule touches) and the mean share of their words the
cut keeps of the request, for the generator and instruction of the default settings.

    python benchmarks/querygen_prompt_budget.py [--data ../shared/datasets/toollens]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformers import AutoTokenizer

from components.data import open_dataset
from components.generative.generate import chat_prompt, chat_prompts
from components.generative.packaged import resolve_lm
from components.methods.querygen.params import QueryGenParams
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "querygen_prompt_budget.json")


SENTINEL = "\x00request\x00"  # where the request goes in the chat template's prompt


def request_in(prompt: str, before: str, after: str) -> str:
    """The request in ``prompt``: what lies between the template's text ``before`` and ``after`` it."""
    if not (prompt.startswith(before) and prompt.endswith(after)):
        raise ValueError("the fitted prompt is not the chat template around a request")
    return prompt[len(before) : len(prompt) - len(after)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--generator", default="smollm2-135m", help="a packaged LM, hub name or directory")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    params = QueryGenParams()
    tokenizer = AutoTokenizer.from_pretrained(resolve_lm(args.generator))
    budget = params.query_max_length

    def size(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    frame = size(chat_prompt(tokenizer, params.system_prompt, ""))
    before, after = chat_prompt(tokenizer, params.system_prompt, SENTINEL).split(SENTINEL)
    dataset = open_dataset(args.data)
    results = []
    for split in ("train", "valid", "test"):
        texts = list(dataset.split_queries(split).values())
        over = [t for t in texts if size(chat_prompt(tokenizer, params.system_prompt, t)) > budget]
        cut = chat_prompts(tokenizer, params.system_prompt, over, budget)
        # Words of the request the fitted prompt keeps: the words of its user turn. (Counted as the
        # prompt's words beyond an empty request's, the closing marker glued to the last request
        # word took one word off every request.)
        kept = [
            len(request_in(p, before, after).split()) / len(t.split()) for p, t in zip(cut, over, strict=True)
        ]
        results.append(
            {
                "method": "querygen",
                "config": {"generator": args.generator, "query_max_length": budget, "frame_tokens": frame},
                "split": split,
                "metrics": {
                    "queries": len(texts),
                    "over_budget": len(over),
                    "over_budget_rate": len(over) / max(len(texts), 1),
                    "words_kept": sum(kept) / len(kept) if kept else 1.0,
                },
            }
        )
    report = {
        "dataset": os.path.basename(os.path.normpath(args.data)),
        "results": results,
        "notes": (
            f"Run: `python benchmarks/querygen_prompt_budget.py --data {args.data}`. Generator "
            f"{args.generator}'s tokenizer, the default instruction; its prompt around an empty request "
            f"is {frame} tokens of the {budget}-token budget (`query_max_length`). `over_budget`: "
            "requests whose whole prompt is longer (the requests the old whole-prompt cut and the "
            "request-only cut treat differently); `over_budget_rate` their share of the split; "
            "`words_kept`: the share of a request's words its fitted prompt's user turn keeps, averaged "
            "over those requests. "
            "Splits as `open_dataset` gives them (valid carved from train)."
        ),
    }
    head = ["split", "queries", "over budget", "share", "words kept"]
    rows = [
        [
            r["split"],
            str(r["metrics"]["queries"]),
            str(r["metrics"]["over_budget"]),
            f"{r['metrics']['over_budget_rate']:.4f}",
            f"{r['metrics']['words_kept']:.2f}",
        ]
        for r in results
    ]
    write_report(
        report,
        args.out,
        title="Query generation: requests over the prompt budget",
        plot=False,
        table=md_table(head, rows),
    )
    print("\n".join(md_table(head, rows)))


if __name__ == "__main__":
    main()
