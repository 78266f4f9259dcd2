"""Perplexity of a fixed general-English text under each LM: what tool training costs the language model.

ToolGen (arXiv 2410.03439) adds one token per tool and ToolWeaver (arXiv 2601.21947) a few shared
code tokens; ToolWeaver reports WikiText-2 perplexity 25.4 after its training against ToolGen's
104.5. No package here ships WikiText-2, so the text is the first six stories of *The Adventures of
Sherlock Holmes* (public domain; `benchmarks/data/sherlock_holmes_i_vi.txt`, ~51k words). Each
``--model NAME=DIR`` is a stage output (an LM bundle) or a backbone name (``smollm2-135m``).
Perplexities compare only between models that share a tokenizer (a stage and the one before it).

    python benchmarks/perplexity_text.py --model smollm2=smollm2-135m \\
        --model toolweaver_warmup=runs/train/<run>-warmup/<checkpoint>/model ...
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from components.generative.bundle import load_bundle  # noqa: E402
from components.generative.lm import to_inference_device  # noqa: E402
from components.generative.perplexity import document_perplexity  # noqa: E402
from workflows.quiet import quiet_libraries  # noqa: E402
from workflows.report import md_table, write_report  # noqa: E402

TEXT = os.path.join(ROOT, "benchmarks", "data", "sherlock_holmes_i_vi.txt")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "perplexity_text.json")


def score(name: str, path: str, text: str, label: str, window: int) -> dict:
    """One row: the model's perplexity of ``text`` (called ``label``) in windows of at most ``window``
    tokens."""
    lm, tokenizer, codebook = load_bundle(path)
    lm = to_inference_device(lm)  # a GPU when the machine has one
    window = min(window, int(getattr(lm.config, "max_position_embeddings", window)))
    started = time.perf_counter()
    ppl, tokens = document_perplexity(lm, tokenizer, text, window=window, batch_size=4)
    return {
        "method": name,
        "config": {
            "model": path,
            "window": window,
            "vocab_size": len(tokenizer),
            "tool_codes": len(codebook),
        },
        "split": label,
        "metrics": {"perplexity": ppl, "tokens": tokens, "seconds": time.perf_counter() - started},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--about", default="", help="where the models come from, for the notes")
    args = parser.parse_args()
    quiet_libraries()
    with open(args.text) as f:
        text = f.read()
    label = os.path.splitext(os.path.basename(args.text))[0]
    rows = []
    for spec in args.model:
        name, sep, path = spec.partition("=")
        if not sep:
            parser.error(f"--model {spec!r}: expected NAME=DIR")
        rows.append(score(name, path, text, label, args.window))
        print(rows[-1]["method"], rows[-1]["metrics"])
    table = md_table(
        ["model", "perplexity", "tokens", "window", "vocabulary", "tool codes", "seconds"],
        [
            [
                r["method"],
                f"{r['metrics']['perplexity']:.2f}",
                str(r["metrics"]["tokens"]),
                str(r["config"]["window"]),
                str(r["config"]["vocab_size"]),
                str(r["config"]["tool_codes"]),
                f"{r['metrics']['seconds']:.1f}",
            ]
            for r in rows
        ],
    )
    report = {"dataset": label, "results": rows, "notes": args.about + "\n"}
    title = f"Perplexity of a general-English text ({label}) under each LM"
    write_report(report, args.out, title=title, plot=False, table=table)


if __name__ == "__main__":
    main()
