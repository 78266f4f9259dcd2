"""Where do ToolLens retrievers miss? Accuracy by how close a query is to the training set.

Every ToolLens test query needs the tool set of a scene seen in training, and many are close
rewrites of a training query. This benchmark bins the queries of valid and test by the cosine to
their nearest training query (TF-IDF over character 2-5-grams) and reports per bin:

- ``queries``, ``share`` of the split and ``tools_per_query`` (R@3 is harder with 3 tools);
- ``other_tools_rate``: how often that nearest training query needs a different tool set
  (near-identical texts written for sibling scenes, e.g. two sources of one API);
- the R@3 of answering with the nearest training query's tools (``nearest_train_query``), of
  the lexical scene SVM of ``toollens_ceiling.py``, and of each saved model passed with
  ``--model NAME=DIR`` (any method artifact, e.g. MassTool's), with ``miss_share``: the bin's
  part of all the recall the model lost on the split.

If the models are near 1.0 on close rewrites and most of their misses are on queries with no
close lexical neighbour, what caps them is generalising from ~15k training queries to new
wordings, not near-duplicates they cannot tell apart.

    python benchmarks/toollens_novelty.py --model masstool=runs/models/masstool [--toollens PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.feature_extraction.text import TfidfVectorizer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.toollens_ceiling import LexicalSceneModel, as_results
from components import methods
from components.data import Dataset, open_dataset
from components.data.types import Queries, Results
from components.metrics import query_metrics, ranked, relevant_tools
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "toollens_novelty.json")
EDGES = (0.9, 0.8, 0.7, 0.6, 0.0)  # lower edges of the cosine bins, highest first
NEIGHBOUR = "nearest_train_query"
Model = Callable[[Queries], Results]  # query texts -> ranked tools, e.g. a saved method's retrieve


def nearest(queries: csr_matrix, pool: csr_matrix, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise nearest pool row and its cosine (rows are L2-normalised TF-IDF vectors).

    ``chunk`` query rows are compared at a time, so memory stays at ``chunk × len(pool)``. Ties go
    to the first pool row (numpy's ``argmax``).
    """
    best = np.empty(queries.shape[0], dtype=np.int64)
    cosine = np.empty(queries.shape[0])
    for start in range(0, queries.shape[0], chunk):
        sims = (queries[start : start + chunk] @ pool.T).toarray()
        best[start : start + chunk] = sims.argmax(1)
        cosine[start : start + chunk] = sims.max(1)
    return best, cosine


def recall_at_3(gold: dict[str, set[str]], results: Results) -> np.ndarray:
    """Per-query R@3 of ``results`` against the tools each query needs, in the order of ``gold``."""
    return np.array([query_metrics(g, ranked(results.get(q, {}), 3), 3)["recall@3"] for q, g in gold.items()])


@dataclass
class SplitRecalls:
    """Per-query arrays of one split, aligned with ``qids``."""

    qids: list[str]
    cosine: np.ndarray  # cosine to the nearest training query
    other: np.ndarray  # that training query needs a different tool set
    tools: np.ndarray  # how many tools the query needs
    recalls: dict[str, np.ndarray]  # model name -> R@3 (the nearest-neighbour answer first)


class TrainingPool:
    """The training queries as TF-IDF character 2-5-gram vectors, for nearest-neighbour lookups."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.qids = list(dataset.qrels["train"])
        self.vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True)
        self.matrix = self.vectorizer.fit_transform([dataset.queries[q] for q in self.qids])

    def recalls(self, split: str, models: dict[str, Model]) -> SplitRecalls:
        """Nearest training query of every judged query of ``split``, and each model's R@3.

        Queries with no relevant tool are left out, as :func:`components.metrics.evaluate_retrieval`
        leaves them out.
        """
        data = self.dataset
        needs = {q: relevant_tools(rel) for q, rel in data.qrels[split].items()}
        gold = {q: tools for q, tools in needs.items() if tools}
        qids = list(gold)
        texts = {q: data.queries[q] for q in qids}
        best, cosine = nearest(self.vectorizer.transform(list(texts.values())), self.matrix)
        found = [relevant_tools(data.qrels["train"][self.qids[j]]) for j in best]
        answers = {q: dict.fromkeys(f, 1.0) for q, f in zip(qids, found, strict=True)}
        recalls = {NEIGHBOUR: recall_at_3(gold, answers)}
        for name, model in models.items():
            recalls[name] = recall_at_3(gold, model(texts))
        other = np.array([gold[q] != f for q, f in zip(qids, found, strict=True)])
        return SplitRecalls(qids, cosine, other, np.array([len(g) for g in gold.values()]), recalls)


def bin_label(i: int) -> str:
    """``[low, high)`` of bin ``i`` of :data:`EDGES` (the top bin is closed at 1)."""
    return f"[{EDGES[i]}, 1]" if i == 0 else f"[{EDGES[i]}, {EDGES[i - 1]})"


def split_rows(split: str, data: SplitRecalls) -> list[dict]:
    """Report rows of one split, per bin and then for all queries.

    The ``nearest_train_query`` row of a bin carries its size: ``queries``, ``share`` of the
    split, ``tools_per_query`` and ``other_tools_rate``. Every model row carries its ``recall@3``
    in the bin and ``miss_share``: the bin's part of everything the model missed on the split.
    """
    if NEIGHBOUR not in data.recalls:
        raise ValueError(f"split_rows needs the {NEIGHBOUR!r} recalls, which carry the bin sizes")
    cosine = data.cosine
    bins = [
        (bin_label(i), (cosine >= low) & (cosine < (EDGES[i - 1] if i else np.inf)))
        for i, low in enumerate(EDGES)
    ]
    bins.append(("all", np.ones_like(cosine, dtype=bool)))
    missed = {name: float((1.0 - r).sum()) for name, r in data.recalls.items()}
    rows = []
    for label, kept in bins:
        n = int(kept.sum())
        size: dict[str, float] = {"queries": n, "share": round(n / len(cosine), 4)}
        if n:
            size["tools_per_query"] = round(float(data.tools[kept].mean()), 4)
            size["other_tools_rate"] = round(float(data.other[kept].mean()), 4)
        for name, r in data.recalls.items():
            metrics = {**size} if name == NEIGHBOUR else {}
            if n:
                metrics["recall@3"] = round(float(r[kept].mean()), 4)
                if missed[name]:
                    metrics["miss_share"] = round(float((1.0 - r[kept]).sum()) / missed[name], 4)
            rows.append(
                {"method": name, "config": {"neighbour_cosine": label}, "split": split, "metrics": metrics}
            )
    return rows


def markdown(rows: list[dict]) -> str:
    """One line per (split, bin): its size, then every model's R@3 (and share of its misses)."""

    def number(metrics: dict, key: str) -> str:
        return f"{metrics[key]:.4f}" if key in metrics else ""

    def recall(metrics: dict) -> str:
        if "recall@3" not in metrics:
            return ""
        share = f" ({metrics['miss_share']:.0%})" if "miss_share" in metrics else ""
        return f"{metrics['recall@3']:.4f}{share}"

    models = list(dict.fromkeys(r["method"] for r in rows))
    lines: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        lines.setdefault((r["split"], r["config"]["neighbour_cosine"]), {})[r["method"]] = r["metrics"]
    cells = []
    for (split, label), by_model in lines.items():
        size = by_model[NEIGHBOUR]
        cells.append(
            [split, label, str(size["queries"]), number(size, "share")]
            + [number(size, "tools_per_query"), number(size, "other_tools_rate")]
            + [recall(by_model[m]) for m in models]
        )
    head = ["split", "neighbour cosine", "queries", "share", "tools/query", "other tools"]
    return "\n".join(md_table(head + [f"R@3 {m} (misses)" for m in models], cells)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", action="append", default=[], help="NAME=DIR of a saved method (repeatable)"
    )
    parser.add_argument(
        "--toollens", default=os.environ.get("TOOLSCOUT_TOOLLENS", "../shared/datasets/toollens")
    )
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--about", default="", help="how the saved models were trained, for the notes")
    args = parser.parse_args()
    for spec in args.model:
        if "=" not in spec:
            parser.error(f"--model takes NAME=DIR, got {spec!r}")
    dataset = open_dataset(args.toollens)  # valid carved from train, as `toolscout bench` does
    tools = list(dataset.corpus)
    svm = LexicalSceneModel().fit(dataset, tools)
    models: dict[str, Model] = {
        "lexical_scene_svm": lambda texts: as_results(list(texts), svm.scores(list(texts.values())), tools)
    }
    for name, path in (spec.split("=", 1) for spec in args.model):
        models[name] = partial(methods.load(path).retrieve, k=10)
    pool = TrainingPool(dataset)
    rows = [row for split in ("valid", "test") for row in split_rows(split, pool.recalls(split, models))]
    notes = (
        "Run: `"
        + " ".join(["python benchmarks/toollens_novelty.py", *(f"--model {m}" for m in args.model)])
        + "`. Queries binned by the cosine to their nearest training query (TF-IDF character "
        "2-5-grams). `other tools`: how often that training query needs a different tool set. "
        f"`R@3 {NEIGHBOUR}`: answering with its tools. `(misses)`: the bin's share of all that the "
        f"model missed on the split. {args.about}\n"
    )
    table = markdown(rows)
    print(table)
    report = {"dataset": "toollens", "notes": notes, "results": rows}
    write_report(
        report,
        args.out,
        title="ToolLens: recall by a query's distance to the training set",
        plot=False,
        table=table,
    )


if __name__ == "__main__":
    main()
