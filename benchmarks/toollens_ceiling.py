"""How far can ToolLens retrieval go without pretrained models? MassTool against a lexical scene model.

Every ToolLens test query needs exactly the tool set of one training scene, so retrieval there is
scene recognition. This benchmark sets a trained MassTool artifact (arXiv 2507.00487) beside a
model of another family, a linear SVM over TF-IDF word 1-2-grams and character 2-5-grams that
classifies the query's scene and ranks that scene's tools, and reports, on valid and test:

- each model alone, and their mix ``(1 - α) · softmax(MassTool) + α · P(scene) · scene_tools``
  with α selected on valid;
- the per-query oracle: for every query the better of the two models' R@3 (not a bound on every
  mix of their rankings, which can combine tools from both lists into a top 3).

    python benchmarks/toollens_ceiling.py --masstool runs/models/masstool [--toollens PATH]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from scipy.sparse import csr_matrix, hstack
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.svm import LinearSVC

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components import methods
from components.data import Dataset, open_dataset
from components.data.types import Qrels, Queries, Results
from components.encoders.retriever import top_k
from components.methods.base import Method
from components.metrics import evaluate_retrieval, query_metrics, relevant_tools
from components.metrics import ranked as ranked_ids
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "toollens_ceiling.json")
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


class LexicalSceneModel:
    """TF-IDF (word 1-2-grams + char 2-5-grams) → LinearSVC over training scenes → tool scores."""

    def __init__(self, c: float = 0.5, sharpness: float = 10.0) -> None:
        self.words = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
        self.chars = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2)
        self.svm = LinearSVC(C=c)
        self.sharpness = sharpness  # SVM margins → scene probabilities via softmax(sharpness · margin)

    def _features(self, texts: list[str], fit: bool = False) -> csr_matrix:
        if fit:
            return hstack([self.words.fit_transform(texts), self.chars.fit_transform(texts)]).tocsr()
        return hstack([self.words.transform(texts), self.chars.transform(texts)]).tocsr()

    def fit(self, dataset: Dataset, tools: list[str]) -> LexicalSceneModel:
        """Learn scenes from the training queries; ``tools`` fixes the column order of scores."""
        scene_of = dataset.query_scene["train"]
        qids = [q for q in dataset.qrels["train"] if q in scene_of]
        self.svm.fit(
            self._features([dataset.queries[q] for q in qids], fit=True), [scene_of[q] for q in qids]
        )
        column = {t: i for i, t in enumerate(tools)}
        self.scene_tools = np.zeros((len(self.svm.classes_), len(tools)))
        for row, scene in enumerate(self.svm.classes_):
            self.scene_tools[row, [column[t] for t in dataset.scene_tool[scene]]] = 1.0
        return self

    def scores(self, texts: list[str]) -> np.ndarray:
        """P(tool needed) per text: scene probabilities summed over each scene's tools."""
        margins = self.svm.decision_function(self._features(texts)) * self.sharpness
        if margins.ndim == 1:  # two scenes: one margin, positive for classes_[1]
            margins = np.stack([-margins, margins], axis=1)
        probs = np.exp(margins - margins.max(axis=1, keepdims=True))
        return (probs / probs.sum(axis=1, keepdims=True)) @ self.scene_tools


def masstool_scores(method: Method, texts: Queries, tools: list[str]) -> np.ndarray:
    """Softmax over every tool of a saved method's scores, one row per text."""
    results = method.retrieve(texts, len(tools))
    column = {t: i for i, t in enumerate(tools)}
    out = np.full((len(texts), len(tools)), -np.inf)
    for row, qid in enumerate(texts):
        for tool, score in results[qid].items():
            out[row, column[tool]] = score
    out = np.exp(out - out.max(axis=1, keepdims=True))
    return out / out.sum(axis=1, keepdims=True)


def as_results(qids: list[str], scores: np.ndarray, tools: list[str], k: int = 10) -> Results:
    """A score matrix as the project's ``Results`` (top ``k`` per query)."""
    return top_k(torch.from_numpy(scores), qids, tools, k)


def oracle_recall(qrels: Qrels, rankings: list[Results], k: int = 3) -> float:
    """Mean over queries of the best R@k among several rankings of the same queries.

    Relevant tools are those with relevance > 0; queries with none are left out, as
    :func:`components.metrics.evaluate_retrieval` leaves them out.
    """
    best = [
        max(query_metrics(relevant, ranked_ids(r[q], k), k)[f"recall@{k}"] for r in rankings)
        for q in qrels
        if (relevant := relevant_tools(qrels[q]))
    ]
    return float(np.mean(best))


METRICS = ("recall@3", "ndcg@3", "comp@3", "recall@5")
# split -> (query ids, MassTool scores, lexical scores), rows aligned
Scores = dict[str, tuple[list[str], np.ndarray, np.ndarray]]


def score_row(
    dataset: Dataset,
    tools: list[str],
    name: str,
    split: str,
    qids: list[str],
    scores: np.ndarray,
    config: dict[str, float],
) -> dict:
    """One report row: the project's metrics of a score matrix on ``split``."""
    metrics = evaluate_retrieval(dataset.qrels[split], as_results(qids, scores, tools))
    return {
        "method": name,
        "config": config,
        "split": split,
        "metrics": {k: round(metrics[k], 4) for k in METRICS},
    }


def compare(dataset: Dataset, tools: list[str], splits: Scores) -> list[dict]:
    """Each model alone, their mix (α chosen on valid by N@3) and the per-query oracle, per split."""
    qids, mt, lex = splits["valid"]
    alpha = max(
        ALPHAS,
        key=lambda a: score_row(dataset, tools, "", "valid", qids, (1 - a) * mt + a * lex, {})["metrics"][
            "ndcg@3"
        ],
    )
    rows = []
    for split, (qids, mt, lex) in splits.items():
        rows += [
            score_row(dataset, tools, "masstool", split, qids, mt, {}),
            score_row(dataset, tools, "lexical_scene_svm", split, qids, lex, {}),
            score_row(dataset, tools, "mix", split, qids, (1 - alpha) * mt + alpha * lex, {"alpha": alpha}),
        ]
        bound = oracle_recall(
            dataset.qrels[split], [as_results(qids, mt, tools), as_results(qids, lex, tools)]
        )
        rows.append(
            {
                "method": "oracle_of_two",
                "config": {},
                "split": split,
                "metrics": {"recall@3": round(bound, 4)},
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    """The report's table."""

    def name(r: dict) -> str:
        return r["method"] + (f" (α {r['config']['alpha']})" if "alpha" in r["config"] else "")

    cells = [
        [name(r), r["split"]] + [f"{r['metrics'][k]:.4f}" if k in r["metrics"] else "" for k in METRICS]
        for r in rows
    ]
    return "\n".join(md_table(["method", "split", "R@3", "N@3", "COMP@3", "R@5"], cells)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masstool", required=True, help="a trained MassTool artifact dir")
    parser.add_argument(
        "--toollens", default=os.environ.get("TOOLSCOUT_TOOLLENS", "../shared/datasets/toollens")
    )
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--about", default="", help="how the MassTool artifact was trained, for the notes")
    args = parser.parse_args()
    dataset = open_dataset(args.toollens)  # valid carved from train, as `toolscout bench` does
    tools = list(dataset.corpus)
    masstool = methods.load(args.masstool)
    lexical = LexicalSceneModel().fit(dataset, tools)
    splits: Scores = {}
    for split in ("valid", "test"):
        texts = dataset.split_queries(split)
        splits[split] = (
            list(texts),
            masstool_scores(masstool, texts, tools),
            lexical.scores(list(texts.values())),
        )
    rows = compare(dataset, tools, splits)
    notes = (
        f"Run: `python benchmarks/toollens_ceiling.py --masstool {args.masstool}`. `oracle_of_two` "
        "takes, for every query, the better R@3 of the two models (not a bound on every mix of their "
        f"rankings, which can combine tools from both lists). {args.about}\n"
    )
    table = markdown(rows)
    print(table)
    report = {"dataset": "toollens", "notes": notes, "results": rows}
    write_report(
        report, args.out, title="ToolLens: MassTool beside a lexical scene model", plot=False, table=table
    )


if __name__ == "__main__":
    main()
