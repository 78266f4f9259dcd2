"""Query generation (arXiv 2412.03573) on ToolLens: retriever alone, zero-shot, SFT and aligned rewriters.

One querygen model is trained stage by stage (retriever, SFT, rejection-sampling alignment) and
after each generator stage the rewriter is scored: the fusion (rewrite alone, or RRF with the
original query) is chosen on a valid prefix, then that one configuration reads the test sample
once. Paired bootstrap intervals compare SFT with the retriever alone and aligned with SFT on the
same test queries. On 2 cores the generator (SmolLM2-135M-Instruct) writes ~2.5 rewrites a second,
so SFT, alignment and test use stated subsamples (``--sft-examples``, ``--align-queries``,
``--test-queries``); a GPU runs the full sets with larger values.

    python benchmarks/querygen_toollens.py --retriever bm25
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from components import methods  # noqa: E402
from components.data import open_dataset  # noqa: E402
from components.methods.querygen.data import choose_fusion  # noqa: E402
from components.metrics import evaluate_retrieval, paired_bootstrap, per_query  # noqa: E402
from components.training.spec import RunSpec  # noqa: E402
from workflows.quiet import quiet_libraries  # noqa: E402
from workflows.ray_env import init_ray  # noqa: E402
from workflows.report import md_table, write_report  # noqa: E402

TOOLLENS = os.path.join(ROOT, "..", "shared", "datasets", "toollens")
METRICS = ("recall@3", "ndcg@3", "comp@3", "recall@5", "ndcg@5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=TOOLLENS)
    parser.add_argument("--retriever", default="bm25", help="a registered method name (untrained: bm25)")
    parser.add_argument("--generator", default="smollm2-135m")
    parser.add_argument("--sft-examples", type=int, default=480)
    parser.add_argument("--align-queries", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--valid-queries", type=int, default=60)
    parser.add_argument("--test-queries", type=int, default=300)
    parser.add_argument(
        "--out", default=os.path.join(ROOT, "benchmarks", "results", "querygen_toollens.json")
    )
    parser.add_argument("--work", default=os.path.join(ROOT, "runs", "querygen_bench"))
    args = parser.parse_args()
    quiet_libraries()
    data = open_dataset(args.data)
    init_ray({"num_cpus": 2, "progress_bars": False})
    params = {
        "generator": {"name_or_path": args.generator},
        "retriever": {"method": args.retriever},
        # LoRA on a 135M LM takes a larger step than full fine-tuning; small batches give a short
        # CPU run more updates (one SmolLM2 step of 16 examples is ~12 s on 2 cores).
        "sft": {"epochs": 1, "lr": 1.0e-3, "batch_size": 8, "max_examples": args.sft_examples},
        "align": {
            "rounds": args.rounds,
            "queries": args.align_queries,
            "samples": 4,
            "epochs": 1,
            "lr": 5.0e-4,
            "batch_size": 8,
        },
        "valid_queries": args.valid_queries,
        "progress": True,
    }
    method = methods.build("querygen", params)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = RunSpec(
        name=f"querygen-{args.retriever}-{stamp}",
        storage_path=os.path.abspath(os.path.join(args.work, "store")),
        local_dir=os.path.abspath(os.path.join(args.work, "local")),
    )
    test_ids = sorted(data.qrels["test"])
    test_ids = sorted(random.Random(0).sample(test_ids, min(args.test_queries, len(test_ids))))
    qrels = {q: data.qrels["test"][q] for q in test_ids}
    queries = {q: data.queries[q] for q in test_ids}
    rows, per, stages = [], {}, {}

    def add_row(name: str, results: dict, config: dict, seconds: float) -> None:
        metrics = evaluate_retrieval(qrels, results, (3, 5))
        rows.append(
            {
                "method": name,
                "config": config,
                "split": f"test (seeded sample of {len(test_ids)})",
                "metrics": {m: metrics[m] for m in METRICS} | {"ms_per_query": seconds},
            }
        )
        per[name] = per_query(qrels, results, "ndcg@3")
        print(name, {m: round(metrics[m], 4) for m in METRICS}, flush=True)

    for stage in method.stages:
        started = time.perf_counter()
        stages[stage] = method.fit(stage, data, run) | {"seconds": time.perf_counter() - started}
        if stage == "retriever":
            add_row(args.retriever, method.retriever.retrieve(queries, 5), {"retriever": args.retriever}, 0.0)
        variant = {"retriever": "zero_shot", "sft": "sft", "align": "aligned"}[stage]
        m = "ndcg@3"
        # The better fusion on the valid prefix; the test sample is read with that one only.
        fusion = choose_fusion(stages[stage], m)
        started = time.perf_counter()
        results = method.retrieve(queries, 5, fusion)
        ms = 1000 * (time.perf_counter() - started) / len(queries)
        config = {
            "retriever": args.retriever,
            "generator": args.generator,
            "fusion": fusion,
            f"valid_generated_{m}": stages[stage].get(f"generated_{m}"),
            f"valid_rrf_{m}": stages[stage].get(f"rrf_{m}"),
        }
        add_row(f"querygen_{variant}_{args.retriever}", results, config, ms)
    comparisons = {}
    for a, b in (
        (args.retriever, f"querygen_sft_{args.retriever}"),
        (f"querygen_sft_{args.retriever}", f"querygen_aligned_{args.retriever}"),
    ):
        comparisons[f"{b} - {a}"] = paired_bootstrap(per[a], per[b])
    report = {
        "dataset": "toollens",
        "results": rows,
        "comparisons_ndcg@3": comparisons,
        "stages": stages,
        "notes": notes(args, stages, comparisons),
    }
    table = md_table(
        ["method", "fusion", *METRICS, "rewrite + retrieve ms/query"],
        [
            [
                r["method"],
                r["config"].get("fusion", "-"),
                *(f"{r['metrics'][m]:.4f}" for m in METRICS),
                f"{r['metrics']['ms_per_query']:.0f}",
            ]
            for r in rows
        ],
    )
    table += ["", "Paired bootstrap of test nDCG@3 differences (95 %):", ""]
    table += md_table(
        ["difference", "mean", "low", "high", "P(not better)"],
        [
            [k, f"{v['mean']:.4f}", f"{v['low']:.4f}", f"{v['high']:.4f}", f"{v['p_not_better']:.3f}"]
            for k, v in comparisons.items()
        ],
    )
    write_report(
        report,
        args.out,
        title="ToolLens: query generation in front of " + args.retriever,
        plot=False,
        table=table,
    )


def notes(args: argparse.Namespace, stages: dict, comparisons: dict) -> str:
    align = stages.get("align", {})
    lines = []
    for r in range(1, args.rounds + 1):
        if f"round{r}_sampled_reward" not in align:
            continue
        line = (
            f"- Alignment round {r}: mean reward of samples {align[f'round{r}_sampled_reward']:.4f}, of kept "
            f"rewrites {align[f'round{r}_best_reward']:.4f} (original queries "
            f"{align[f'round{r}_original_reward']:.4f}), kept {align[f'round{r}_kept']:.2%}"
        )
        if f"round{r}_chosen_nll_before" in align:
            before, after = align[f"round{r}_chosen_nll_before"], align[f"round{r}_chosen_nll_after"]
            line += f", NLL of the kept rewrites {before:.3f} -> {after:.3f}"
        lines.append(line)
    return (
        f"Run: `python benchmarks/querygen_toollens.py --retriever {args.retriever}` on the 2-core CPU "
        f"machine. Generator {args.generator} with LoRA (r 16); SFT on {args.sft_examples} training "
        f"queries (1 epoch, batch 8, lr 1e-3); {args.rounds} rejection-sampling rounds of "
        f"{args.align_queries} training queries x 4 samples (1 epoch each, batch 8, lr 5e-4), reward: "
        "nDCG@3 of the retriever's ranking for the sampled rewrite; fusion "
        f"chosen on the first {args.valid_queries} valid queries; test: a seeded sample of "
        f"{args.test_queries} of ToolLens's 1,877 test queries, read once per row. Subsamples because "
        "generation is the cost on CPU.\n\n" + "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()
