"""ToolGen or ToolWeaver on ToolLens: the bench rows plus what the papers' questions need.

ToolGen (arXiv 2410.03439) and ToolWeaver (arXiv 2601.21947) share the LM stages; the config's
entry names which (``--entry``; its ``method``, else the entry name). For each split mode (standard,
cold start) the method is trained once, every stage a Ray Train run whose checkpoints are chosen on
valid, then these rows are scored on valid / test (/ test_unseen), ``<m>`` the method's name:

* ``<m>``: all stages, constrained beam search (what ``retrieve`` does);
* ``<m>_unconstrained``: all stages, free beam search through ``generate`` (outputs naming no
  tool are dropped from the ranking and counted in ``hallucination``);
* ``<m>_retrieval_stage``: the model after the retrieval stage alone (before agent tuning);
* ``<m>_untrained``: the warmed-up LM with codes added but no tool stage (ToolGen's tool tokens
  initialised from names; ToolWeaver's code tokens from the mean row).

``hallucination`` is the share of generated beams that name something that is no real tool, and
``empty`` the share that end before naming anything; on the constrained row they are measured
through the same ``generate`` call with the trie constraint. Perplexity of held-out
valid queries (before tool tokens / after all stages), vocabulary sizes and stage timings go to the
notes. Dense rows from ``toollens_dense*.json`` are copied in for comparison when present.

    python benchmarks/toolgen.py [--config workflows/configs/toollens_toolgen.yaml] \\
        [--modes standard cold_start] [--entry toolgen]
    python benchmarks/toolgen.py --config workflows/configs/toollens_toolweaver.yaml --entry toolweaver
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# On a shared machine a spinning OpenMP thread whose core is taken stalls every torch op (several
# times slower steps); passive waiting keeps two threads useful. Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from components import methods
from components.config import load_config, merge
from components.data import Dataset, dataset_from_config
from components.generative.hallucination import empty_rate, hallucination_rate, outputs_to_results
from components.methods.codelm import CodeLMMethod
from components.metrics import DEFAULT_KS, evaluate_retrieval
from workflows.bench import add_training, device_name, report_splits, split_rows
from workflows.cli_config import packaged_config
from workflows.quiet import quiet_libraries
from workflows.ray_env import init_ray
from workflows.report import markdown_table, md_table, write_report
from workflows.train import fit_method, run_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DENSE = {"standard": "toollens_dense.json", "cold_start": "toollens_dense_cold_start.json"}
LOAD_START = os.getloadavg()[0]  # other jobs on the machine inflate the stage timings


def free_rows(method: CodeLMMethod, data: Dataset, label: str, constrained: bool) -> list[dict[str, Any]]:
    """Rows from ``generate`` beams: retrieval metrics of the real tools named, and the hallucination rate."""
    rows = []
    for split in report_splits(data):
        started = time.perf_counter()
        queries = data.split_queries(split)
        outputs = method.generate(queries, max(DEFAULT_KS), constrained=constrained)
        metrics = evaluate_retrieval(
            data.qrels[split], outputs_to_results(list(queries), outputs, max(DEFAULT_KS))
        )
        metrics["hallucination_rate"] = hallucination_rate(outputs)
        metrics["empty_rate"] = empty_rate(outputs)
        rows.append(
            {
                "method": label,
                "split": split,
                "metrics": metrics,
                "eval_seconds": time.perf_counter() - started,
            }
        )
    return rows


def run_mode(
    cfg: dict[str, Any], mode: str, name: str, stamp: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train the entry ``name`` on one split mode; every row and the diagnostics."""
    cfg = merge(cfg, {"splits": {"mode": mode}})
    data = dataset_from_config(cfg)
    entry = cfg["bench"]["methods"][name]
    kind = entry.get("method", name)
    method = methods.build(kind, entry.get("params"))
    assert isinstance(method, CodeLMMethod), f"{kind} does not retrieve by generating codes"
    # The same stamp resumes the mode's Ray Train runs: finished stages load their best checkpoint.
    run = run_spec(cfg, f"{data.name}-{kind}-{mode}-{stamp or time.strftime('%Y%m%d-%H%M%S')}")
    trained = fit_method(method, data, run)
    suffix = "" if mode == "standard" else f" [{mode}]"
    rows = split_rows(method, data, f"{kind}{suffix}")
    # The constrained row's hallucination rate: the same generate call as below, plus the trie.
    for row, free in zip(rows, free_rows(method, data, "", constrained=True), strict=True):
        row["metrics"]["hallucination_rate"] = free["metrics"]["hallucination_rate"]
        row["metrics"]["generate_recall@3"] = free["metrics"]["recall@3"]
    rows += free_rows(method, data, f"{kind}_unconstrained{suffix}", constrained=False)
    params = entry.get("params") or {}
    stage_dirs = (("retrieval_stage", method.stage_dirs["retrieval"]), ("untrained", method.untrained_dir()))
    for label, stage_dir in stage_dirs:
        other = type(method).from_dir(stage_dir, params)
        other.share_codes(method)
        other.index(data.corpus)  # tools without a code get one here (ToolGen: from their names)
        rows += split_rows(other, data, f"{kind}_{label}{suffix}")
    add_training(rows, trained, run)
    config = method.config()
    for row in rows:
        row["config"] = config  # the stage-only rows are stages of this configuration
    diagnostics = {
        "stages": trained["stages"],
        "train_seconds": trained["train_seconds"],
        "known_tools": len(method.codebook) - len(method.added_after_training),
        "added_after_training": len(method.added_after_training),
        "added_tokens": method.added_tokens(),
        "device": device_name(run),
        "stage_dirs": dict(method.stage_dirs),  # each stage's chosen model (perplexity_text.py reads them)
        **({"cold_start": dict(method.cold_start)} if hasattr(method, "cold_start") else {}),
    }
    return rows, diagnostics


def dense_rows(mode: str) -> list[dict[str, Any]]:
    """The dense bi-encoder's test rows from its own bench file, for the comparison table."""
    path = os.path.join(ROOT, "benchmarks", "results", DENSE[mode])
    if not os.path.exists(path):
        return []
    with open(path) as f:
        report = json.load(f)
    suffix = "" if mode == "standard" else f" [{mode}]"
    return [
        {**r, "method": f"{r['method']}{suffix} (from {DENSE[mode]})"}
        for r in report["results"]
        if r["method"].startswith("dense") and r["split"] != "valid"
    ]


def codes_notes(diagnostics: dict[str, dict[str, Any]]) -> list[str]:
    """ToolWeaver's code statistics per split mode (nothing for ToolGen)."""
    rows = []
    for mode, d in diagnostics.items():
        codes = d["stages"].get("codes")
        if not codes:
            continue
        cold = d.get("cold_start", {})
        rows.append(
            [
                mode,
                f"{codes['tools']:.0f}",
                f"{codes['collision_rate_before_pass']:.4f}",
                f"{codes['collision_rate_after_pass']:.4f}",
                f"{codes['first_level_codes_used']:.0f}",
                f"{codes['co_used_first_level_shared']:.4f}",
                f"{cold.get('tools', 0):.0f}",
                f"{cold.get('collided_before_pass', 0):.0f}",
            ]
        )
    if not rows:
        return []
    header = [
        "split mode",
        "tools coded",
        "collision rate before pass",
        "after pass",
        "first-level codes used",
        "co-used pairs sharing first code (weighted)",
        "tools coded after training",
        "of which collided before the pass",
    ]
    return ["", *md_table(header, rows)]


def devices(diagnostics: dict[str, dict[str, Any]]) -> str:
    """The devices the split modes trained on, for the notes."""
    return ", ".join(sorted({d.get("device", "?") for d in diagnostics.values()}))


def notes(diagnostics: dict[str, dict[str, Any]]) -> str:
    """Stage table (epochs, valid score, seconds) and the perplexity / vocabulary table."""
    nan = float("nan")
    stages = [
        [
            mode,
            stage,
            str(d["config_stages"][stage]["epochs"]),
            f"{s.get('valid_score', nan):.4f}",
            f"{s['stage_seconds']:.0f}",
        ]
        for mode, d in diagnostics.items()
        for stage, s in d["stages"].items()
    ]
    vocab = [
        [
            mode,
            f"{d['stages']['warmup'].get('perplexity_before', nan):.2f}",
            f"{d['stages']['agent'].get('perplexity_after', nan):.2f}",
            f"{d['stages']['warmup'].get('vocab_before', 0):.0f}",
            f"{d['stages']['agent'].get('vocab_size', 0):.0f}",
            str(d.get("added_tokens", "")),
            str(d["added_after_training"]),
            f"{d['train_seconds']:.0f}",
        ]
        for mode, d in diagnostics.items()
    ]
    lines = [
        f"Each stage is one Ray Train run ({devices(diagnostics)}); checkpoints are chosen on valid,",
        f"test is read for this report only. {os.cpu_count()}-core machine, 1-min load average",
        f"{LOAD_START:.1f} at the start and {os.getloadavg()[0]:.1f} at the end. `hallucination_rate` =",
        "share of generated beams naming no real tool (10 beams per query, `generate`); constrained",
        "rows use the tool trie.",
        "",
        *md_table(["split mode", "stage", "epochs", "valid score", "stage seconds"], stages),
        "",
        *md_table(
            [
                "split mode",
                "perplexity before",
                "perplexity after",
                "vocab before",
                "vocab after",
                "tokens added",
                "tools added after training",
                "train seconds",
            ],
            vocab,
        ),
        "",
        "Perplexity: valid query text under the LM after the plain-text warm-up (before tool tokens)",
        "and after all stages (tool or code tokens in the softmax), over the first 500 valid queries.",
        *codes_notes(diagnostics),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", default=os.path.join(ROOT, "workflows", "configs", "toollens_toolgen.yaml")
    )
    parser.add_argument("--modes", nargs="+", default=["standard", "cold_start"])
    parser.add_argument("--entry", default="toolgen", help="bench.methods entry of the config")
    parser.add_argument("--out", default=None, help="results JSON (default: the config's bench.out)")
    parser.add_argument(
        "--resume", default=None, metavar="STAMP", help="resume the runs of this time stamp (YYYYmmdd-HHMMSS)"
    )
    args = parser.parse_args()
    quiet_libraries()
    cfg = load_config(args.config, defaults=packaged_config("default"))
    # The 2-core machine by default; a config's ``ray.num_cpus`` (a GPU machine's cores) wins.
    init_ray({"num_cpus": 2, **(cfg.get("ray") or {}), "progress_bars": False})
    started = time.perf_counter()
    results, diagnostics = [], {}
    for mode in args.modes:
        rows, diagnostics[mode] = run_mode(cfg, mode, args.entry, args.resume)
        diagnostics[mode]["config_stages"] = rows[0]["config"]["stages"]
        results += rows + dense_rows(mode)
    report = {
        "dataset": cfg["data"].get("name") or "toollens",
        "split_mode": "+".join(args.modes),
        "select_metric": "valid score per stage (ndcg@3 for retrieval)",
        "results": results,
        "diagnostics": diagnostics,
        "seconds": time.perf_counter() - started,
        "notes": notes(diagnostics),
    }
    write_report(report, args.out or cfg["bench"]["out"], title=cfg["bench"].get("title", "ToolGen"))
    print(markdown_table(report))


if __name__ == "__main__":
    main()
