"""``toolscout evaluate``: score a saved artifact on a split and write the metrics table."""

from __future__ import annotations

import time
from typing import Any

from components import methods
from components.config import ConfigError, as_list
from components.data import Dataset, dataset_from_config, io
from components.data.types import Results
from components.methods.base import Method
from components.metrics import DEFAULT_KS, evaluate_retrieval, score_detection
from components.registry import ModelRegistry, RegistrySettings, is_model_uri
from components.registry.splits import splits_differ
from workflows.report import strict_json
from workflows.train import model_name


def score(
    method: Method,
    dataset: Dataset,
    split: str,
    ks: tuple[int, ...] = DEFAULT_KS,
    rankings: dict[str, Results] | None = None,
) -> dict[str, float]:
    """Retrieve for every query of ``split`` and compute the metrics (plus ``eval_seconds``); the
    rankings they were computed from go to ``rankings[split]`` when a dict is given, for per-query
    statistics (:func:`components.metrics.per_query`) without retrieving twice.

    A method with a tool-usage detector (``detect``) is also scored on detection: the split's
    queries with a relevant tool (they need one; a query judged only irrelevant says nothing
    either way and is left out, as retrieval leaves it out) against the no-tool queries of the
    same split, as ``detect_*``.
    """
    started = time.perf_counter()
    queries = dataset.split_queries(split)
    results = method.retrieve(queries, max(ks))
    metrics = evaluate_retrieval(dataset.qrels[split], results, ks)
    if split == "test_unseen":
        metrics |= {f"new_{k}": v for k, v in new_tool_metrics(dataset, results, ks).items()}
    negatives = dataset.neg_split.get(split, [])
    if "detect" in method.capabilities and negatives:
        det = score_detection(
            method.detect, queries, dataset.qrels[split], negatives, float(method.detect_threshold)
        )
        metrics |= {f"detect_{k}": v for k, v in det.items()}
    metrics["eval_seconds"] = time.perf_counter() - started
    if rankings is not None:
        rankings[split] = results
    return metrics


def new_tool_metrics(
    dataset: Dataset, results: dict[str, dict[str, float]], ks: tuple[int, ...]
) -> dict[str, float]:
    """``test_unseen``'s rankings scored on its new tools alone (the ``new_*`` metrics).

    Each query there needs at least one tool no training query needs, and most of its other
    judgements are of seen companions (on ToolLens, most of the split's relevant pairs): its plain
    recall mixes finding the new tools with finding those. Here each query keeps only its
    judgements of tools without a training edge, so the figure is about the new tools.
    """
    trained = dataset.trained_tools()
    new = {
        q: {t: s for t, s in rel.items() if t not in trained}
        for q, rel in dataset.qrels["test_unseen"].items()
    }
    new = {q: rel for q, rel in new.items() if any(s > 0 for s in rel.values())}
    return evaluate_retrieval(new, results, ks) if new else {}


def evaluate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Evaluate ``cfg["evaluate"]["artifact"]`` on ``cfg["evaluate"]["splits"]``; write JSON if asked.

    The artifact is a directory or a registry URI; by default the newest registered version of
    the config's model (``models:/<dataset>-<method>/latest``). The default split is ``valid``:
    the test split is for final reports only.
    """
    ecfg = cfg.get("evaluate", {})
    dataset = dataset_from_config(cfg)
    artifact = ecfg.get("artifact")
    if not artifact:
        if not cfg.get("method", {}).get("name"):
            raise ValueError("evaluate: pass --artifact (a dir or models:/ URI), or set method.name")
        artifact = f"models:/{model_name(cfg, dataset.name)}/latest"
    splits = as_list(ecfg.get("splits", ["valid"]), "evaluate.splits")
    if not splits:  # an empty table and exit code 0 read as a clean evaluation
        raise ConfigError("evaluate.splits is empty: name at least one split, e.g. valid")
    local = artifact
    if is_model_uri(artifact):
        registry = ModelRegistry(RegistrySettings.from_config(cfg.get("registry")))
        version = registry.lookup(artifact)  # one read: the version checked is the one downloaded
        # Valid is carved from train by the config's splits: under other settings than the
        # version trained with, most of it is queries it trained on, and the score is memorised.
        # Checked before the download, which a refusal would waste (a large model from s3://).
        differ = splits_differ(registry, version, cfg.get("splits")) if "valid" in splits else None
        if differ:
            raise ConfigError(
                f"evaluate: {artifact} (v{version.number}) was trained with other splits, as "
                f"(trained with, given): {differ}; its valid split would hold queries it trained on. "
                "Set splits to those it was trained with"
            )
        local = registry.local_dir(version)
    method = methods.load(local)
    rows = []
    for split in splits:
        metrics = score(method, dataset, split)
        # The timing beside the metrics, as bench and run write it (and the tables read it).
        row = {"method": method.name, "config": method.config(), "split": split, "metrics": metrics}
        rows.append(row | {"eval_seconds": metrics.pop("eval_seconds")})
    report = {"dataset": dataset.name, "artifact": artifact, "results": rows}
    write_output(cfg, report)
    return report


def output_options(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """How ``evaluate.output`` is reached: its own storage options, else the data's (an s3://
    report beside s3 data)."""
    return (cfg.get("evaluate") or {}).get("storage_options") or (cfg.get("data") or {}).get(
        "storage_options"
    )


def write_output(cfg: dict[str, Any], report: dict[str, Any]) -> None:
    """``report`` as JSON at ``evaluate.output`` if set: a local path or an ``s3://`` URL."""
    output = (cfg.get("evaluate") or {}).get("output")
    if output:
        io.write_bytes(output, strict_json(report), output_options(cfg))


def remove_old_output(cfg: dict[str, Any]) -> None:
    """Delete the file at ``evaluate.output`` (an earlier run's report; a run writes it only at
    the end, so a failed run left the old one in place). Only a file: a directory there is refused,
    not deleted with everything in it.

    Raises:
        ConfigError: ``evaluate.output`` names a directory (or an object-store prefix).
    """
    output = (cfg.get("evaluate") or {}).get("output")
    if not output:
        return
    fs = io.filesystem(output, output_options(cfg))
    if fs.isdir(output):
        raise ConfigError(f"evaluate.output: {output} is a directory; name the report's file (a .json)")
    if fs.exists(output):
        fs.rm_file(output)
