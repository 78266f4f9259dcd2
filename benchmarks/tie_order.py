"""How much the tie rule of evaluation moves BM25's figures: equal scores by tool id (before) or in
the method's own order (now, ``components.metrics.by_score``).

BM25 gives equal scores to tools with the same term statistics and keeps those tied at its cut in
catalog order; serving returns that order. Evaluation ranked ties by tool id, so metrics at 3 taken
from a top 10 scored other tied tools than the method's own top 3. This scores each BM25 profile's
top 10 on ToolLens's valid split (carved from train; test is not read) under both rules, to bound
the change in the BM25 rows scored before the rule changed.

    python benchmarks/tie_order.py [--data ../shared/datasets/toollens]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.data import open_dataset
from components.methods.bm25.method import BM25Method
from components.metrics import evaluate_retrieval
from workflows.report import write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tie_order.json")
SHOWN = ("recall@1", "recall@3", "recall@5", "ndcg@1", "ndcg@3", "ndcg@5", "comp@3", "comp@5")


def by_id(results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """``results`` with each ranking reordered by the rule before (best score first, equal scores
    by tool id): scored in their given order (the rule now), they score as the old rule did."""
    return {q: dict(sorted(found.items(), key=lambda i: (-i[1], i[0]))) for q, found in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    dataset = open_dataset(args.data)
    qrels, queries = dataset.qrels["valid"], dataset.split_queries("valid")
    results, largest = [], 0.0
    for profile in ("default", "lucene", "colt"):
        bm25 = BM25Method(profile)
        bm25.index(dataset.corpus)
        found = bm25.retrieve(queries, 10)
        now = evaluate_retrieval(qrels, found)
        before = evaluate_retrieval(qrels, by_id(found))
        for rule, scored in (("by_id", before), ("method_order", now)):
            results.append(
                {
                    "method": f"bm25_{profile}_{rule}",
                    "config": {"profile": profile, "ties": rule, "depth": 10},
                    "split": "valid",
                    "metrics": {k: scored[k] for k in SHOWN},
                }
            )
        largest = max(largest, *(abs(now[k] - before[k]) for k in SHOWN))
    report = {
        "dataset": os.path.basename(os.path.normpath(args.data)),
        "results": results,
        "largest_change": largest,
        "notes": (
            f"Run: `python benchmarks/tie_order.py --data {args.data}`. Each BM25 profile's top 10 "
            "on ToolLens valid (carved from train; test not read), scored under the old tie rule "
            "(`by_id`) and the new one (`method_order`: equal scores as BM25 cut them, catalog "
            f"order). Largest change of any figure shown: {largest:.4f}. BM25 rows in results "
            "scored before the change (the committed figures of other benchmarks' BM25 baselines) "
            "can differ from a rerun by about this much."
        ),
    }
    write_report(report, args.out, title="Tie order of evaluation: BM25 on ToolLens valid")
    print(f"largest change {largest:.4f}; wrote {args.out}")


if __name__ == "__main__":
    main()
