"""A swept config against the hand-picked one across seeds: is the sweep's gain on test real?

A sweep reads test once for its selected config and once for the hand-picked baseline, each
trained with ``train.seed``; a difference of the size of one seed's spread says nothing either way
(``benchmarks/results/toollens_masstool_minilm_tune_recheck.md``). This trains both configs again
with each of ``--seeds`` and reads valid and test for every run, paired by seed: the same stages
re-seeded for both, the same shared first stage (MassTool's semantic encoder, trained once with
``train.seed`` and found in its cache, as in the sweep and its seed re-check). Nothing is selected
here: both configs were fixed before this runs (the sweep selected on valid), so these test
readings measure the selected config's test figure and its spread, they choose nothing.

Every finished run, with its per-query R@3 and N@3, is appended to ``<work>/runs.jsonl`` at once,
so an interrupted benchmark started again with the same arguments trains only the runs it lacks.
The per-query values give a second view: each query's difference averaged over the seeds, with a
bootstrap interval over queries, which the seeds do not resample.

    python benchmarks/tune_seeds.py -c workflows/configs/toollens_masstool_minilm.yaml \\
        --baseline masstool_minilm_cpu \\
        --selected benchmarks/results/toollens_masstool_minilm_tune_recheck_best.yaml \\
        --seeds 0 1 2 3 4 --shared semantic
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components import methods
from components.config import load_config
from components.data import dataset_from_config
from components.metrics import paired_bootstrap, per_query
from workflows.bench import split_rows
from workflows.ray_env import init_ray
from workflows.report import md_table, write_report
from workflows.train import run_spec

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tune_seeds.json")
SHOWN = ("recall@3", "ndcg@3", "recall@5", "comp@5", "detect_accuracy", "detect_auroc")
# Kept per query for every run, for the bootstrap over queries.
PER_QUERY = ("recall@3", "ndcg@3")


def entry_params(cfg: dict[str, Any], name: str, where: str) -> tuple[str, dict[str, Any]]:
    """The method name and params of ``bench.methods[name]`` in a config read from ``where``."""
    entries = (cfg.get("bench") or {}).get("methods") or {}
    if name not in entries:
        raise SystemExit(f"{where}: bench.methods has no entry {name!r}; it has {sorted(entries)}")
    entry = entries[name]
    return entry.get("method", name), dict(entry.get("params") or {})


def check_shared(configs: dict[str, tuple[str, dict[str, Any]]], shared: list[str], seed: int) -> None:
    """Refuse shared stages the configs would train differently (then a "shared" stage would be
    trained once per config, and the comparison would mix two encoders)."""
    for stage in shared:
        settings = {}
        for label, (name, params) in configs.items():
            method = methods.build(name, params)
            if stage not in method.stages:
                raise SystemExit(f"--shared {stage}: {label} ({name}) has no stage {stage!r}")
            settings[label] = method.stage_settings(stage, seed)
        if len({json.dumps(s, sort_keys=True, default=str) for s in settings.values()}) > 1:
            raise SystemExit(f"--shared {stage}: the configs train it differently: {settings}")


def fingerprint(cfg: dict[str, Any], name: str, params: dict[str, Any], shared: Any) -> str:
    """What a label's runs trained: its method and params, the data and splits, the shared stage."""
    what = {
        "method": name,
        "params": params,
        "data": cfg.get("data"),
        "splits": cfg.get("splits"),
        "shared": shared,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def train_and_score(
    cfg: dict[str, Any],
    label: str,
    name: str,
    params: dict[str, Any],
    seed: int,
    shared: list[str],
    dataset: Any,
) -> dict[str, Any]:
    """Train one config with ``seed`` for its own stages (``train.seed`` for the shared ones) and
    score it on valid and test, keeping each query's R@3 and N@3 (:data:`PER_QUERY`)."""
    method = methods.build(name, params)
    run = run_spec(cfg, f"tune-seeds-{label}-seed{seed}")
    own = replace(run, seed=seed)
    started = time.perf_counter()
    for stage in method.stages:
        method.fit(stage, dataset, run if stage in shared else own)
    method.index(dataset.corpus)
    seconds = time.perf_counter() - started
    rankings: dict[str, Any] = {}
    rows = split_rows(method, dataset, label, rankings=rankings)
    queries = {
        split: {m: per_query(dataset.qrels[split], results, m) for m in PER_QUERY}
        for split, results in rankings.items()
    }
    return {"label": label, "seed": seed, "train_seconds": seconds, "rows": rows, "per_query": queries}


def summary(runs: list[dict[str, Any]], labels: list[str], split: str) -> dict[str, Any]:
    """Per config: mean and sd of each shown metric over the seeds; per metric: the paired
    differences (second label minus first) by seed, their mean, sd and how many are > 0 / < 0."""
    by = {(r["label"], r["seed"]): next(x["metrics"] for x in r["rows"] if x["split"] == split) for r in runs}
    seeds = sorted({s for (label, s) in by if all((other, s) in by for other in labels)})
    out: dict[str, Any] = {"seeds": seeds, "configs": {}, "paired": {}}
    for label in labels:
        out["configs"][label] = {
            k: {
                "mean": statistics.fmean(by[label, s][k] for s in seeds),
                "sd": statistics.stdev([by[label, s][k] for s in seeds]) if len(seeds) > 1 else 0.0,
            }
            for k in SHOWN
        }
    first, second = labels
    for k in SHOWN:
        diffs = [by[second, s][k] - by[first, s][k] for s in seeds]
        out["paired"][k] = {
            "by_seed": diffs,
            "mean": statistics.fmean(diffs),
            "sd": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
            "above": sum(d > 0 for d in diffs),
            "below": sum(d < 0 for d in diffs),
        }
    return out


def query_bootstrap(runs: list[dict[str, Any]], labels: list[str], split: str) -> dict[str, Any] | None:
    """Selected minus baseline per query on ``split``, each query's value first averaged over the
    paired seeds, with a 95 % bootstrap interval over queries (:func:`paired_bootstrap`).

    The seeds resample training, not queries: a difference steady across seeds can still be one
    that another draw of 1.8k queries would not show. None when a paired run has no per-query
    values (a ``runs.jsonl`` line written before they were kept).
    """
    by = {(r["label"], r["seed"]): (r.get("per_query") or {}).get(split) for r in runs}
    seeds = sorted({s for (_, s) in by if all((label, s) in by for label in labels)})
    if not seeds or any(by[label, s] is None for label in labels for s in seeds):
        return None
    out: dict[str, Any] = {"seeds": seeds}
    for metric in PER_QUERY:
        means = []
        for label in labels:
            values = [by[label, s][metric] for s in seeds]
            common = set.intersection(*(set(v) for v in values))
            means.append({q: statistics.fmean(v[q] for v in values) for q in common})
        out[metric] = paired_bootstrap(means[0], means[1], samples=10000)
    return out


def bootstrap_table(boot: dict[str, dict[str, Any] | None], labels: list[str]) -> str:
    """One row per split and metric: the mean per-query difference and its interval."""
    body = [
        [
            split,
            metric,
            str(len(b["seeds"])),
            f"{r['mean']:+.4f}",
            f"[{r['low']:+.4f}, {r['high']:+.4f}]",
            f"{r['p_not_better']:.3f}",
            f"{r['queries']:.0f}",
        ]
        for split, b in boot.items()
        if b
        for metric, r in ((m, b[m]) for m in PER_QUERY)
    ]
    if not body:
        return ""
    head = ["split", "metric", "seeds", f"{labels[1]} − {labels[0]}", "95% interval", "share ≤ 0", "queries"]
    title = "## Over queries: per-query difference averaged over the seeds, bootstrap over queries\n\n"
    return title + "\n".join(md_table(head, body)) + "\n\n"


def tables(summaries: dict[str, dict[str, Any]], labels: list[str]) -> str:
    """The per-config means and the paired differences, one table per split."""
    text = []
    for split, s in summaries.items():
        body = [
            [
                label,
                *(
                    f"{s['configs'][label][k]['mean']:.4f} ± {s['configs'][label][k]['sd']:.4f}"
                    for k in SHOWN
                ),
            ]
            for label in labels
        ]
        paired = s["paired"]
        body.append(
            [
                f"{labels[1]} − {labels[0]} (paired)",
                *(
                    f"{p['mean']:+.4f} ± {p['sd']:.4f} ({p['above']}↑ {p['below']}↓)"
                    for p in (paired[k] for k in SHOWN)
                ),
            ]
        )
        text.append(f"## {split}: mean ± sd over seeds {s['seeds']}\n")
        text += md_table(["config", *SHOWN], body)
        text.append("")
    return "\n".join(text) + "\n"


def per_seed_table(runs: list[dict[str, Any]]) -> str:
    """Every run's valid N@3 and test figures, by seed (the shown metrics every run has)."""
    tests = [next(x["metrics"] for x in r["rows"] if x["split"] == "test") for r in runs]
    shown = [k for k in SHOWN if all(k in t for t in tests)]
    body = []
    for r in sorted(runs, key=lambda r: (r["seed"], r["label"])):
        split = {x["split"]: x["metrics"] for x in r["rows"]}
        body.append(
            [
                str(r["seed"]),
                r["label"],
                f"{split['valid']['ndcg@3']:.4f}",
                *(f"{split['test'][k]:.4f}" for k in shown),
                f"{r['train_seconds']:.0f}",
            ]
        )
    head = ["seed", "config", "valid ndcg@3", *(f"test {k}" for k in shown), "train s"]
    return "## Every run\n\n" + "\n".join(md_table(head, body)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", required=True, help="the bench config holding the baseline entry")
    parser.add_argument("--baseline", required=True, help="the hand-picked bench.methods entry")
    parser.add_argument("--selected", required=True, help="the sweep's _best.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--shared", nargs="*", default=[], help="stages trained once with train.seed")
    parser.add_argument("--work", default="runs/tune_seeds")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--title", default="A swept config against the hand-picked one across seeds")
    parser.add_argument("--note", default="", help="the run's circumstances, put before the tables")
    args = parser.parse_args()

    cfg = load_config(args.config)
    best = load_config(args.selected)
    chosen = (best.get("bench") or {}).get("run") or []
    if len(chosen) != 1:
        raise SystemExit(f"{args.selected}: expected one bench.run entry (a _best.yaml), got {chosen}")
    configs = {
        args.baseline: entry_params(cfg, args.baseline, args.config),
        chosen[0]: entry_params(best, chosen[0], args.selected),
    }
    labels = list(configs)
    base_seed = run_spec(cfg, "check").seed
    check_shared(configs, args.shared, base_seed)
    os.makedirs(args.work, exist_ok=True)
    cfg["train"] = {
        **cfg.get("train", {}),
        "storage_path": os.path.join(args.work, "train"),
        "local_dir": os.path.join(args.work, "checkpoints"),
    }
    log = os.path.join(args.work, "runs.jsonl")
    runs = []
    if os.path.exists(log):
        with open(log, encoding="utf-8") as f:
            runs = [json.loads(line) for line in f if line.strip()]
    dataset = dataset_from_config(cfg)
    # A cached run counts for a label only if it trained what the label names now, on the same
    # data and splits: matched on label and seed alone, a changed config or another -c reused runs
    # of other settings without a word.
    settings = {label: fingerprint(cfg, *configs[label], args.shared) for label in labels}
    for seed in args.seeds:
        # Baseline then selected at each seed: machine drift over the hour falls on both alike.
        for label in labels:
            if any(
                r["label"] == label and r["seed"] == seed and r.get("settings") == settings[label]
                for r in runs
            ):
                continue
            init_ray({"local": True})  # only when something is trained: a rerun that only reports needs none
            name, params = configs[label]
            print(f"tune_seeds: {label} seed {seed}", file=sys.stderr, flush=True)
            run = train_and_score(cfg, label, name, params, seed, args.shared, dataset)
            run["settings"] = settings[label]
            runs.append(run)
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps(run) + "\n")
    runs = [r for r in runs if r["seed"] in args.seeds and r.get("settings") == settings.get(r["label"])]
    summaries = {split: summary(runs, labels, split) for split in ("valid", "test")}
    boot = {split: query_bootstrap(runs, labels, split) for split in ("valid", "test")}
    results = [
        {**row, "config": {"seed": r["seed"], **row["config"]}, "train_seconds": r["train_seconds"]}
        for r in runs
        for row in r["rows"]
    ]
    t = summaries["test"]["paired"]
    notes = (
        f"Run: `python benchmarks/tune_seeds.py -c {args.config} --baseline {args.baseline} --selected "
        f"{args.selected} --seeds {' '.join(map(str, args.seeds))}"
        + (f" --shared {' '.join(args.shared)}" if args.shared else "")
        + f"`. {args.note}\n\nEach config trained once per seed (the seed of every stage but "
        f"{', '.join(args.shared) or 'none'}, which kept train.seed = {base_seed} and was trained once), "
        "scored on valid and on test; paired differences are the selected config's figure minus the "
        "hand-picked one's at the same seed (↑: seeds where the selected config is higher). Nothing is "
        f"selected on these readings. Test, selected − hand-picked: R@3 {t['recall@3']['mean']:+.4f} "
        f"({t['recall@3']['above']} of {len(summaries['test']['seeds'])} seeds higher), N@3 "
        f"{t['ndcg@3']['mean']:+.4f} ({t['ndcg@3']['above']} higher)"
        + (
            f"; over test queries (seed-averaged), N@3 {boot['test']['ndcg@3']['mean']:+.4f}, 95% interval"
            f" [{boot['test']['ndcg@3']['low']:+.4f}, {boot['test']['ndcg@3']['high']:+.4f}].\n"
            if boot["test"]
            else ".\n"
        )
    )
    report = {
        "dataset": dataset.name,
        "results": results,
        "summary": summaries,
        "bootstrap": boot,
        "notes": notes,
    }
    write_report(
        report,
        args.out,
        title=args.title,
        plot=False,
        table=tables(summaries, labels) + bootstrap_table(boot, labels) + per_seed_table(runs),
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
