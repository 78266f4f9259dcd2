"""``toolscout bench``: train each method, select its settings on valid, report on the test splits.

Model selection never sees test: every candidate setting of a method is scored on ``valid``
(carved from train), the best by ``bench.select_metric`` is kept, and only that one is scored on
``test`` (and ``test_unseen`` in the cold-start split mode).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import torch
from tqdm import tqdm

from components import methods
from components.config import ConfigError, as_list, merge
from components.data import Dataset, dataset_from_config
from components.data.types import Results
from components.metrics import DEFAULT_KS, evaluate_retrieval
from components.training.spec import RunSpec
from workflows.evaluate import score
from workflows.report import write_report
from workflows.train import fit_method, run_spec

TEST_SPLITS = ("test", "test_unseen")


def expand_grid(grid: dict[str, list] | None) -> list[dict[str, Any]]:
    """Every combination of a ``{param: [values]}`` grid (one empty combination if no grid)."""
    if not grid:
        return [{}]
    # One value is a grid of one (a string was iterated character by character, a number raised);
    # an empty list would leave no combination to select.
    values = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
    empty = [k for k, v in values.items() if not v]
    if empty:
        raise ConfigError(f"bench grid: {empty} list no value; give each grid key at least one")
    keys = list(values)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(values[k] for k in keys))]


def bench_entry(
    name: str, entry: dict[str, Any], dataset: Dataset, cfg: dict[str, Any]
) -> list[dict[str, Any]]:
    """Select one method entry's settings on valid; return its valid and test rows."""
    method_name = entry.get("method", name)
    metric = cfg["bench"].get("select_metric", "ndcg@3")
    best: tuple[float, Any, dict] | None = None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    combos = expand_grid(entry.get("grid"))
    for i, combo in enumerate(tqdm(combos, desc=f"{name}: select on valid", leave=False)):
        params = merge(entry.get("params") or {}, combo)
        method = methods.build(method_name, params)
        run = run_spec(cfg, f"{dataset.name}-{name}-{stamp}-{i}", scope=f"{name}-{i}")
        trained = fit_method(method, dataset, run)
        valid = score(method, dataset, "valid")
        if best is None or valid[metric] > best[0]:
            best = (valid[metric], method, trained)
    assert best is not None
    _, method, trained = best
    if cfg["bench"].get("save_models"):
        # The selected model, reloadable by name (e.g. benchmarks/toollens_novelty.py --model).
        method.save(os.path.join(cfg["bench"]["save_models"], name))
    rows = []
    # A method with several scoring modes (dense: text tower, ID head, their mix) gets a valid row
    # each; test is read for the mode fit selected on valid only (dense: the mix), the last mode
    # with the selected weight.
    variants = method.variants() if "variants" in method.capabilities else {"": None}
    chosen = getattr(method, "mix", None)
    selected = next((mode for mode, mix in reversed(variants.items()) if mix is None or mix == chosen), None)
    if selected is None:
        raise ValueError(
            f"{name}: its mix {chosen!r} is none of its variants {variants}; fit must set mix to one"
        )
    for mode, mix in variants.items():
        if mix is not None:
            method.mix = mix
        splits = None if mode == selected else ["valid"]
        rows += split_rows(method, dataset, f"{name}_{mode}" if mode else name, splits=splits)
    if chosen is not None:
        method.mix = chosen
    add_training(rows, trained, run)
    return rows


def add_training(rows: list[dict[str, Any]], trained: dict[str, Any], run: RunSpec) -> None:
    """Put on each row what its training cost: seconds, where it trained, and the peak memory (the
    largest over the stages this entry trained; a reused cached stage reports none)."""
    peaks = [s["peak_memory_mb"] for s in trained["stages"].values() if "peak_memory_mb" in s]
    device = device_name(run)
    for row in rows:
        row["train_seconds"] = trained["train_seconds"]
        row["device"] = device
        if peaks:
            row["peak_memory_mb"] = round(max(peaks), 1)


def device_name(run: RunSpec) -> str:
    """The accelerator a run trained on, by name, or the CPU and its core count."""
    if run.use_gpu and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({os.cpu_count()} cores)"


def report_splits(dataset: Dataset) -> list[str]:
    """The splits a report covers: valid, then each test split the dataset has."""
    return ["valid", *(s for s in TEST_SPLITS if dataset.qrels.get(s))]


def split_rows(
    method: Any,
    dataset: Dataset,
    label: str,
    ks: tuple[int, ...] = DEFAULT_KS,
    splits: list[str] | None = None,
    rankings: dict[str, Results] | None = None,
) -> list[dict[str, Any]]:
    """One result row per split of ``splits`` (default :func:`report_splits`), scored with
    :func:`score` (each split's rankings kept in ``rankings`` when a dict is given)."""
    config = method.config()
    rows = []
    for split in splits or report_splits(dataset):
        metrics = score(method, dataset, split, ks, rankings)
        rows.append(
            {
                "method": label,
                "config": config,
                "split": split,
                "metrics": metrics,
                "eval_seconds": metrics.pop("eval_seconds"),
            }
        )
    return rows


def check_bench_metric(metric: str) -> None:
    """``bench.select_metric`` must name a metric the valid scoring computes (``recall@3``, ...)."""
    # Every ranking metric the scoring computes; ``queries`` is a count, the same for every model.
    names = set(evaluate_retrieval({"q": {"t": 1.0}}, {"q": {"t": 1.0}})) - {"queries"}
    if metric not in names:
        raise ConfigError(f"bench.select_metric: expected one of {sorted(names)}, got {metric!r}")


def bench(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run the benchmark described by ``cfg`` and write JSON, markdown and a Recall@K plot.

    ``cfg["bench"]["methods"]`` maps entry names to ``{method, params, grid}``;
    ``cfg["bench"]["run"]`` lists the entries to run (all by default).
    """
    bcfg = cfg["bench"]
    started = time.perf_counter()
    entries = bcfg["methods"]
    wanted = as_list(bcfg.get("run") or list(entries), "bench.run")
    unknown = [w for w in wanted if w not in entries]
    if unknown:
        raise ConfigError(f"bench.run: unknown method entries {unknown}; configured: {sorted(entries)}")
    # Checked before any training: a misspelt metric would otherwise fail after the first model.
    check_bench_metric(bcfg.get("select_metric", "ndcg@3"))
    dataset = dataset_from_config(cfg)
    results: list[dict[str, Any]] = []

    def report(done: int) -> dict[str, Any]:
        left = len(wanted) - done
        partial = {"notes": f"Partial: {done} of {len(wanted)} entries finished.\n"} if left else {}
        return partial | {
            "dataset": dataset.name,
            "split_mode": (cfg.get("splits") or {}).get("mode", "standard"),
            "select_metric": bcfg.get("select_metric", "ndcg@3"),
            "results": results,
            "seconds": time.perf_counter() - started,
            # Written after every entry, so a long run that is interrupted keeps what it finished.
            "entries_done": wanted[:done],
            "complete": done == len(wanted),
        }

    for done, name in enumerate(tqdm(wanted, desc="methods"), start=1):
        results += bench_entry(name, entries[name], dataset, cfg)
        if bcfg.get("out"):
            last = done == len(wanted)
            write_report(
                report(done),
                bcfg["out"],
                title=bcfg.get("title", ""),
                plot=last and bool(bcfg.get("plot", True)),
            )
    return report(len(wanted))
