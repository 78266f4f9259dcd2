"""Where do ToolLens retrievers miss? Accuracy by how close a query is to the training set.

Every ToolLens test query needs the tool set of a scene seen in training, and many are close
rewrites of a training query. This benchmark bins the queries of valid and test by the cosine to
their nearest training query (TF-IDF over character 2-5-grams) and reports per bin:

- ``queries`` and ``share`` of the split;
- ``other_tools_rate``: how often that nearest training query needs a different tool set
  (near-identical texts written for sibling scenes, e.g. two sources of one API);
- the R@3 of answering with the nearest training query's tools (``nearest_train_query``), of
  the lexical scene SVM of ``toollens_ceiling.py``, and of each saved model passed with
  ``--model NAME=DIR`` (any method artifact, e.g. MassTool's).

If the models are near 1.0 on close rewrites and lose their recall on queries unlike any
training query, what caps them is generalisation from 17k training queries (what a pretrained
encoder brings), not near-duplicates they cannot tell apart.

    python benchmarks/toollens_novelty.py --model masstool=runs/models/masstool [--toollens PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.feature_extraction.text import TfidfVectorizer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.toollens_ceiling import LexicalSceneModel
from components import methods
from components.data import Dataset, open_dataset
from components.data.types import Results
from components.metrics import query_metrics, ranked
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "toollens_novelty.json")
EDGES = (0.9, 0.8, 0.7, 0.6, 0.0)  # lower edges of the cosine bins, highest first
NEIGHBOUR = "nearest_train_query"


def nearest(queries: csr_matrix, pool: csr_matrix, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise nearest pool row and its cosine (rows are L2-normalised TF-IDF vectors).

    ``chunk`` query rows are compared at a time, so memory stays at ``chunk × len(pool)``.
    """
    best = np.empty(queries.shape[0], dtype=np.int64)
    cosine = np.empty(queries.shape[0])
    for start in range(0, queries.shape[0], chunk):
        sims = (queries[start : start + chunk] @ pool.T).toarray()
        best[start : start + chunk] = sims.argmax(1)
        cosine[start : start + chunk] = sims.max(1)
    return best, cosine


def relevant(dataset: Dataset, split: str, qid: str) -> set[str]:
    """The tools ``qid`` needs in ``split`` (relevance > 0)."""
    return {t for t, s in dataset.qrels[split][qid].items() if s > 0}


def recall_at_3(dataset: Dataset, split: str, results: Results) -> np.ndarray:
    """Per-query R@3 of ``results``, in the order of ``dataset.qrels[split]``."""
    return np.array(
        [
            query_metrics(relevant(dataset, split, q), ranked(results.get(q, {}), 3), 3)["recall@3"]
            for q in dataset.qrels[split]
        ]
    )


def bin_label(i: int) -> str:
    """``[low, high)`` of bin ``i`` of :data:`EDGES` (the top bin is closed at 1)."""
    return f"[{EDGES[i]}, 1]" if i == 0 else f"[{EDGES[i]}, {EDGES[i - 1]})"


def split_rows(
    split: str, cosine: np.ndarray, other: np.ndarray, recalls: dict[str, np.ndarray]
) -> list[dict]:
    """Report rows of one split: per bin (then all queries), its size and each model's R@3.

    Args:
        cosine: Each query's cosine to its nearest training query.
        other: Whether that training query needs a different tool set.
        recalls: Model name -> per-query R@3 (the nearest-neighbour answer among them).
    """
    bins = [
        (bin_label(i), (cosine >= low) & (cosine < (EDGES[i - 1] if i else np.inf)))
        for i, low in enumerate(EDGES)
    ]
    bins.append(("all", np.ones_like(cosine, dtype=bool)))
    rows = []
    for label, kept in bins:
        n = int(kept.sum())
        size = {"queries": n, "share": round(n / len(cosine), 4)}
        if n:
            size["other_tools_rate"] = round(float(other[kept].mean()), 4)
        for name, r in recalls.items():
            metrics = {**size} if name == NEIGHBOUR else {}
            if n:
                metrics["recall@3"] = round(float(r[kept].mean()), 4)
            rows.append(
                {"method": name, "config": {"neighbour_cosine": label}, "split": split, "metrics": metrics}
            )
    return rows


def markdown(rows: list[dict]) -> str:
    """One line per (split, bin): its size, then every model's R@3 side by side."""
    models = list(dict.fromkeys(r["method"] for r in rows))
    lines: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        lines.setdefault((r["split"], r["config"]["neighbour_cosine"]), {})[r["method"]] = r["metrics"]
    cells = []
    for (split, label), by_model in lines.items():
        size = by_model[NEIGHBOUR]
        cells.append(
            [split, label, str(size["queries"]), f"{size['share']:.4f}"]
            + [f"{size['other_tools_rate']:.4f}" if "other_tools_rate" in size else ""]
            + [f"{by_model[m]['recall@3']:.4f}" if "recall@3" in by_model[m] else "" for m in models]
        )
    head = ["split", "neighbour cosine", "queries", "share", "other tools", *(f"R@3 {m}" for m in models)]
    return "\n".join(md_table(head, cells)) + "\n"


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
    train = list(dataset.qrels["train"])
    vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True)
    pool = vectorizer.fit_transform([dataset.queries[q] for q in train])
    svm = LexicalSceneModel().fit(dataset, tools)
    saved = {name: methods.load(path) for name, path in (spec.split("=", 1) for spec in args.model)}
    rows = []
    for split in ("valid", "test"):
        texts = dataset.split_queries(split)
        qids = list(texts)
        best, cosine = nearest(vectorizer.transform(list(texts.values())), pool)
        neighbour_tools = [relevant(dataset, "train", train[j]) for j in best]
        other = np.array(
            [relevant(dataset, split, q) != n for q, n in zip(qids, neighbour_tools, strict=True)]
        )
        answers = {q: {t: 1.0 for t in n} for q, n in zip(qids, neighbour_tools, strict=True)}
        svm_scores = svm.scores(list(texts.values()))
        svm_results = {
            q: dict(zip(tools, row.tolist(), strict=True)) for q, row in zip(qids, svm_scores, strict=True)
        }
        recalls = {
            NEIGHBOUR: recall_at_3(dataset, split, answers),
            "lexical_scene_svm": recall_at_3(dataset, split, svm_results),
        }
        for name, method in saved.items():
            recalls[name] = recall_at_3(dataset, split, method.retrieve(texts, 10))
        rows += split_rows(split, cosine, other, recalls)
    notes = (
        "Run: `python benchmarks/toollens_novelty.py "
        + " ".join(f"--model {spec}" for spec in args.model)
        + "`. Queries binned by the cosine to their nearest training query (TF-IDF character "
        "2-5-grams). `other tools`: how often that training query needs a different tool set. "
        f"`R@3 {NEIGHBOUR}`: answering with its tools. {args.about}\n"
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
