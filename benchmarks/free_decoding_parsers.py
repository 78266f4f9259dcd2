"""The same free-decoding beams of a trained ToolGen / ToolWeaver model, read by two parsers.

ToolGen (arXiv 2410.03439, Sec. 5) reports how often free decoding names a tool that does not
exist. Until 206adc9 a beam named a tool only when its whole output, up to end of sequence, was one
code or one name, and a beam that named nothing counted as a hallucination. Now a beam also names
the tool whose whole code it begins with when text follows (the agent stage's ``\\nAction Input:``),
and an empty beam is counted apart (``empty_rate``). This scores one set of beams both ways, so
the change of parser is measured apart from any change of model.

    python benchmarks/free_decoding_parsers.py --model <stage dir> [--config ...] [--entry toolgen]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components import methods
from components.config import load_config
from components.data import dataset_from_config
from components.generative.hallucination import Output, empty_rate, hallucination_rate, outputs_to_results
from components.methods.codelm import CodeLMMethod
from components.metrics import DEFAULT_KS, evaluate_retrieval
from workflows.cli_config import packaged_config
from workflows.quiet import quiet_libraries
from workflows.report import write_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def whole_output(method: CodeLMMethod, beams: list[list[Output]]) -> list[list[Output]]:
    """The beams as the parser before 206adc9 read them: a tool only when the whole output (up to
    end of sequence) is one code or one tool's text; anything else, an empty beam included, none."""
    parser = method.output_parser()
    out = []
    for row in beams:
        kept = []
        for o in row:
            tool = method.codebook.tool_of(o.tokens)
            if tool is None and o.tokens:
                text = parser.tokenizer.decode(o.tokens).strip().casefold()
                tool = parser.by_text.get(text)
            kept.append(Output(o.tokens, o.score, tool if tool in parser.catalog else None, empty=o.empty))
        out.append(kept)
    return out


def rows(method: CodeLMMethod, queries: dict[str, str], qrels: dict, split: str) -> list[dict[str, Any]]:
    """One row per parser over the same free beams of ``queries``."""
    k = max(DEFAULT_KS)
    started = time.perf_counter()
    beams = method.generate(queries, k, constrained=False)
    seconds = time.perf_counter() - started
    out = []
    for label, read in (("whole_output", whole_output(method, beams)), ("code_prefix", beams)):
        metrics = evaluate_retrieval(qrels, outputs_to_results(list(queries), read, k))
        metrics |= {"hallucination_rate": hallucination_rate(read), "empty_rate": empty_rate(read)}
        if label == "whole_output":  # that parser counted an empty beam as a hallucination
            metrics["hallucination_rate"] += metrics["empty_rate"]
        out.append(
            {
                "method": f"{method.name}_unconstrained ({label})",
                "config": {"parser": label},
                "split": split,
                "metrics": metrics,
                "eval_seconds": seconds,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an LM stage's output directory (the agent stage's)")
    parser.add_argument(
        "--config", default=os.path.join(ROOT, "workflows", "configs", "toollens_toolgen.yaml")
    )
    parser.add_argument("--entry", default="toolgen", help="bench.methods entry of the config")
    parser.add_argument("--splits", nargs="+", default=["valid", "test"])
    parser.add_argument(
        "--out", default=os.path.join(ROOT, "benchmarks", "results", "free_decoding_parsers.json")
    )
    args = parser.parse_args()
    quiet_libraries()
    cfg = load_config(args.config, defaults=packaged_config("default"))
    data = dataset_from_config(cfg)
    entry = cfg["bench"]["methods"][args.entry]
    method = methods.method_class(entry.get("method", args.entry)).from_dir(args.model, entry.get("params"))
    assert isinstance(method, CodeLMMethod), f"{args.entry} does not retrieve by generating codes"
    method.index(data.corpus)
    results = []
    for split in args.splits:
        results += rows(method, data.split_queries(split), data.qrels[split], split)
    notes = (
        f"Model: `{args.model}`. One set of free beams per split ({max(DEFAULT_KS)} per query, "
        "`generate`), read twice: `whole_output` is the parser before 206adc9 (a tool only when the "
        "whole output is one code or name; an empty beam counted as a hallucination), `code_prefix` "
        "the parser now (also the tool whose whole code a beam begins with, text following; empty "
        "beams counted apart as `empty_rate`). `eval_seconds`: the one decoding both rows share."
    )
    report = {"dataset": data.name, "model": args.model, "results": results, "notes": notes}
    write_report(report, args.out, title="Free decoding read by the whole-output and the code-prefix parsers")
    print(
        json.dumps([(r["split"], r["config"]["parser"], r["metrics"]["hallucination_rate"]) for r in results])
    )


if __name__ == "__main__":
    main()
