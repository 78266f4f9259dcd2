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
from workflows.bench import device_name  # noqa: E402
from workflows.quiet import quiet_libraries  # noqa: E402
from workflows.ray_env import init_ray  # noqa: E402
from workflows.report import md_table, write_report  # noqa: E402

TOOLLENS = os.path.join(ROOT, "..", "shared", "datasets", "toollens")
METRICS = ("recall@3", "ndcg@3", "comp@3", "recall@5", "ndcg@5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=TOOLLENS)
    parser.add_argument(
        "--retriever", help="a registered method name, trained in the retriever stage (default bm25)"
    )
    parser.add_argument(
        "--retriever-path",
        help="a saved retriever artifact directory (e.g. one that `toolscout bench ... "
        "bench.save_models=DIR` kept) instead of --retriever; the rows are named after the directory. "
        "It must have been trained on the same --split-mode: one trained on the standard split has seen "
        "the unseen-tool split's tools",
    )
    parser.add_argument("--generator", default="smollm2-135m")
    parser.add_argument("--sft-examples", type=int, default=480)
    parser.add_argument("--align-queries", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--valid-queries", type=int, default=60)
    parser.add_argument("--test-queries", type=int, default=300, help="0: the whole test split")
    parser.add_argument("--batch-size", type=int, default=8, help="training batch of every generator stage")
    parser.add_argument("--eval-batch-size", type=int, default=32, help="prompts per generate call")
    parser.add_argument(
        "--split-mode",
        choices=("standard", "cold_start"),
        default="standard",
        help="cold_start: 10%% of the tools are absent from training; test is the queries that need them",
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="train on the GPU in bf16 (one Ray Train worker) and generate there; every core to Ray",
    )
    parser.add_argument(
        "--gpu-fraction",
        type=float,
        default=1.0,
        help="the share of the GPU (and of 8 CPUs) the training worker asks Ray for: 0.5 lets two runs "
        "joined to one cluster (RAY_ADDRESS) train side by side on one GPU",
    )
    parser.add_argument(
        "--out", default=os.path.join(ROOT, "benchmarks", "results", "querygen_toollens.json")
    )
    parser.add_argument("--work", default=os.path.join(ROOT, "runs", "querygen_bench"))
    args = parser.parse_args()
    retriever_name, retriever = retriever_spec(parser, args)
    if not 0 < args.gpu_fraction <= 1:
        parser.error(f"--gpu-fraction must be in (0, 1], got {args.gpu_fraction}")
    quiet_libraries()
    data = open_dataset(args.data, {"mode": args.split_mode})
    test_split = "test" if args.split_mode == "standard" else "test_unseen"
    cores = os.cpu_count() or 2
    # The 2-core machine by default. With --gpu, a minimal Ray (no dashboard packages) on every core.
    ray_cfg = {"num_cpus": cores, "num_gpus": 1, "include_dashboard": False} if args.gpu else {"num_cpus": 2}
    init_ray({**ray_cfg, "progress_bars": False})
    sft_examples = args.sft_examples or None  # 0: every training query
    params = {
        "generator": {"name_or_path": args.generator},
        "retriever": retriever,
        # LoRA on a 135M LM takes a larger step than full fine-tuning; small batches give a short
        # CPU run more updates (one SmolLM2 step of 16 examples is ~12 s on 2 cores).
        "sft": {"epochs": 1, "lr": 1.0e-3, "batch_size": args.batch_size, "max_examples": sft_examples},
        "align": {
            "rounds": args.rounds,
            "queries": args.align_queries,
            "samples": 4,
            "epochs": 1,
            "lr": 5.0e-4,
            "batch_size": args.batch_size,
        },
        "valid_queries": args.valid_queries,
        "eval_batch_size": args.eval_batch_size,
        "progress": True,
    }
    method = methods.build("querygen", params)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    worker = {"CPU": max(1, int(min(8, cores) * args.gpu_fraction)), "GPU": args.gpu_fraction}
    gpu = {"use_gpu": True, "resources_per_worker": worker, "precision": "bf16"}
    run = RunSpec(
        name=f"querygen-{retriever_name}-{args.split_mode}-{stamp}",
        storage_path=os.path.abspath(os.path.join(args.work, "store")),
        local_dir=os.path.abspath(os.path.join(args.work, "local")),
        **(gpu if args.gpu else {}),
    )
    device = device_name(run) + (", bf16 training" if args.gpu else "")
    test_ids = sorted(data.qrels[test_split])
    if args.test_queries:
        test_ids = sorted(random.Random(0).sample(test_ids, min(args.test_queries, len(test_ids))))
    qrels = {q: data.qrels[test_split][q] for q in test_ids}
    queries = {q: data.queries[q] for q in test_ids}
    rows, per, stages = [], {}, {}

    def add_row(name: str, results: dict, config: dict, seconds: float) -> None:
        metrics = evaluate_retrieval(qrels, results, (3, 5))
        rows.append(
            {
                "method": name,
                "config": config,
                "split": test_split
                if len(test_ids) == len(data.qrels[test_split])
                else f"{test_split} (seeded sample of {len(test_ids)})",
                "metrics": {m: metrics[m] for m in METRICS} | {"ms_per_query": seconds},
            }
        )
        per[name] = per_query(qrels, results, "ndcg@3")
        print(name, {m: round(metrics[m], 4) for m in METRICS}, flush=True)

    def save(complete: bool) -> None:
        """Write the report as it stands; a run cut short (a lent GPU's time ran out) keeps its rows."""
        comparisons = {
            f"{b} - {a}": paired_bootstrap(per[a], per[b])
            for a, b in (
                (retriever_name, f"querygen_sft_{retriever_name}"),
                (f"querygen_sft_{retriever_name}", f"querygen_aligned_{retriever_name}"),
            )
            if a in per and b in per
        }
        report = {
            "dataset": "toollens",
            "split_mode": args.split_mode,
            "device": device,
            "complete": complete,
            "results": rows,
            "comparisons_ndcg@3": comparisons,
            "stages": stages,
            "notes": notes(args, device, stages, len(test_ids), len(data.qrels[test_split]), complete),
        }
        write_report(
            report,
            args.out,
            title=f"ToolLens{'' if args.split_mode == 'standard' else ', unseen-tool split'}: query "
            f"generation in front of {retriever_name} ({device})",
            plot=False,
            table=report_table(rows, comparisons),
        )

    for stage in method.stages:
        started = time.perf_counter()
        stages[stage] = method.fit(stage, data, run) | {"seconds": time.perf_counter() - started}
        if stage == "retriever":
            # Timed as the rewriter rows are (it was a 0.0 placeholder in the table, read as a time).
            started = time.perf_counter()
            alone = method.retriever.retrieve(queries, 5)
            ms = 1000 * (time.perf_counter() - started) / len(queries)
            add_row(retriever_name, alone, {"retriever": retriever_name}, ms)
        variant = {"retriever": "zero_shot", "sft": "sft", "align": "aligned"}[stage]
        m = "ndcg@3"
        # The better fusion on the valid prefix; the test sample is read with that one only.
        fusion = choose_fusion(stages[stage], m)
        started = time.perf_counter()
        results = method.retrieve(queries, 5, fusion)
        ms = 1000 * (time.perf_counter() - started) / len(queries)
        config = {
            "retriever": retriever_name,
            "generator": args.generator,
            "fusion": fusion,
            f"valid_generated_{m}": stages[stage].get(f"generated_{m}"),
            f"valid_rrf_{m}": stages[stage].get(f"rrf_{m}"),
        }
        add_row(f"querygen_{variant}_{retriever_name}", results, config, ms)
        save(complete=stage == method.stages[-1])


def retriever_spec(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The retriever's row name and its ``retriever`` params, from --retriever or --retriever-path."""
    if args.retriever and args.retriever_path:
        parser.error("give --retriever or --retriever-path, not both")
    if args.retriever_path:
        if not os.path.isdir(args.retriever_path):
            parser.error(f"--retriever-path {args.retriever_path}: not a directory")
        path = os.path.normpath(args.retriever_path)
        return os.path.basename(path), {"path": os.path.abspath(path)}
    name = args.retriever or "bm25"
    return name, {"method": name}


def report_table(rows: list[dict], comparisons: dict) -> list[str]:
    """The rows' test metrics, then the paired bootstrap intervals of the differences."""
    table = md_table(
        ["method", "fusion", *METRICS, "rewrite + retrieve ms/query"],
        [
            [
                r["method"],
                r["config"].get("fusion") or "-",
                *(f"{r['metrics'][m]:.4f}" for m in METRICS),
                # Absent from rows transcribed from a run's log (querygen_toollens_gpu.md).
                "-" if r["metrics"].get("ms_per_query") is None else f"{r['metrics']['ms_per_query']:.0f}",
            ]
            for r in rows
        ],
    )
    if comparisons:
        table += ["", "Paired bootstrap of test nDCG@3 differences (95 %):", ""]
        table += md_table(
            ["difference", "mean", "low", "high", "P(not better)"],
            [
                [k, f"{v['mean']:.4f}", f"{v['low']:.4f}", f"{v['high']:.4f}", f"{v['p_not_better']:.3f}"]
                for k, v in comparisons.items()
            ],
        )
    return table


def notes(
    args: argparse.Namespace, device: str, stages: dict, tested: int, test_size: int, complete: bool = True
) -> str:
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
    command = " ".join(["python benchmarks/querygen_toollens.py", *sys.argv[1:]])
    sft = f"{args.sft_examples} training queries" if args.sft_examples else "every training query"
    split = (
        "the standard split"
        if args.split_mode == "standard"
        else (
            "the unseen-tool split (10% of the tools held out of training; test: the queries that need one)"
        )
    )
    test = f"all {test_size}" if tested == test_size else f"a seeded sample of {tested} of {test_size}"
    return (
        f"Run: `{command}` on {device}; {split}. Generator {args.generator} with LoRA "
        f"(r 16); SFT on {sft} (1 epoch, batch {args.batch_size}, lr 1e-3); {args.rounds} "
        f"rejection-sampling rounds of {args.align_queries} training queries x 4 samples (1 epoch "
        f"each, batch {args.batch_size}, lr 5e-4), reward: nDCG@3 of the retriever's ranking for the "
        f"sampled rewrite; fusion chosen on the first {args.valid_queries} valid queries; test: {test} "
        "test queries, read once per row."
        + ("" if complete else " Incomplete: rewritten after every row, this run has not reached the last.")
        + "\n\n"
        + "\n".join(lines)
        + "\n"
    )


if __name__ == "__main__":
    main()
