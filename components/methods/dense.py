"""Dense retrieval: a bi-encoder trained with in-batch negatives, plus an optional tool-ID head.

The text tower follows the dense baselines of the tool-retrieval papers (COLT, CIKM 2024;
MassTool, arXiv 2507.00487): queries and tool documents share an encoder, trained with the
multiple-negatives ranking loss, with other relevant tools of a multi-tool query masked out of the
negatives. The ID head (one learned vector per training tool) adds a classifier-style score;
``mix`` weighs the two at retrieval time and is selected on valid. Unseen tools (cold start) have
no ID vector and are scored by their text alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import ray
import torch

from components.data.tooltext import TOOL_FIELDS, tool_document
from components.data.types import Corpus, Dataset, Queries, Results
from components.encoders import TextEncoder
from components.encoders.text_encoder import spec_from
from components.methods.base import RunSpec, read_config, write_config
from components.methods.dense_model import BiEncoder
from components.metrics import check_select_metric, evaluate_retrieval
from components.training.inputs import share

if TYPE_CHECKING:
    from components.methods.dense_task import DenseTask

# (queries, k) -> (scores, indices), as faiss's Index.search returns them.
Searcher = Callable[[torch.Tensor, int], tuple[np.ndarray, np.ndarray]]


@dataclass
class DenseParams:
    """Hyper-parameters of the dense method (the ``method.params`` config section)."""

    encoder: dict[str, Any] | str = field(default_factory=dict)  # EncoderSpec fields, or a hub name/path
    id_head: bool = True
    mix: float = 0.5  # retrieval score = (1 - mix) * text + mix * id
    mix_grid: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    temperature: float = 0.05
    id_loss_weight: float = 1.0
    epochs: int = 8
    batch_size: int = 64
    lr: float = 5e-4
    weight_decay: float = 0.01
    tool_fields: tuple[str, ...] = TOOL_FIELDS
    tool_max_length: int = 96
    select_metric: str = "ndcg@3"
    index_backend: str = "exact"  # "exact" (torch matmul) | "faiss" (inner-product index, large corpora)
    progress: bool = False

    def __post_init__(self) -> None:
        check_select_metric("dense", self.select_metric)


def tool_texts(corpus: Corpus, ids: list[str], fields: tuple[str, ...]) -> list[str]:
    """The text tower's input for each tool id."""
    return [tool_document(corpus[t], list(fields)) for t in ids]


def combined_tools(tools: torch.Tensor, ids: torch.Tensor | None, mix: float) -> torch.Tensor:
    """Tool vectors whose inner product with a query is the mixed score.

    ``(1 - mix) * q·t + mix * q·e = q·((1 - mix) * t + mix * e)``, so one inner-product index serves
    every mix. Tools without an ID vector (added after training) use their text vector for ``e``.

    Args:
        tools: ``(T, d)`` normalised tool-text embeddings.
        ids: ``(T, d)`` normalised ID vectors aligned with ``tools`` (NaN rows for unseen tools).
    """
    if ids is None or mix == 0.0:
        return tools
    by_id = torch.where(torch.isnan(ids[:, :1]), tools, ids)
    return (1.0 - mix) * tools + mix * by_id


def score_matrix(
    query: torch.Tensor, tools: torch.Tensor, ids: torch.Tensor | None, mix: float
) -> torch.Tensor:
    """``(Q, T)`` mixed scores (see :func:`combined_tools`)."""
    return query @ combined_tools(tools, ids, mix).T


def top_k(scores: torch.Tensor, qids: list[str], tool_ids: list[str], k: int) -> Results:
    """Results dict from a score matrix."""
    values, index = scores.topk(min(k, scores.shape[1]), dim=1)
    return {
        q: {tool_ids[j]: float(v) for v, j in zip(values[i].tolist(), index[i].tolist(), strict=True)}
        for i, q in enumerate(qids)
    }


class DenseMethod:
    """Bi-encoder dense retrieval with an optional tool-ID head (see module docstring)."""

    name: ClassVar[str] = "dense"
    stages: ClassVar[tuple[str, ...]] = ("contrastive",)

    def __init__(self, **params: Any) -> None:
        self.params = DenseParams(**params)
        self.mix = self.params.mix if self.params.id_head else 0.0
        self.model: BiEncoder | None = None
        self.tool_ids: list[str] = []
        self._tools: torch.Tensor | None = None
        self._ids: torch.Tensor | None = None

    @classmethod
    def from_model(cls, model: BiEncoder, params: DenseParams) -> DenseMethod:
        method = cls(**asdict(params))
        method.model = model
        return method

    @classmethod
    def stage_task(cls, stage: str, config: dict[str, Any]) -> DenseTask:
        """The worker-side training task of ``stage`` (see :mod:`components.training.task`)."""
        from components.methods.dense_task import DenseTask

        if stage != "contrastive":
            raise ValueError(f"dense has stages {cls.stages}, not {stage!r}")
        return DenseTask(config)

    def config(self) -> dict[str, Any]:
        return {**asdict(self.params), "mix": self.mix}

    def variants(self) -> dict[str, float]:
        """Scoring modes reported by ``bench``: text tower, ID head and their selected mix.

        Tools the ID head has no vector for (added after training, ``test_unseen``) are scored by
        their text in every mode, so ``id`` rows on unseen tools are text scores for those tools.
        """
        if self.model is None or self.model.id_embeddings is None:
            return {"text": 0.0}
        return {"text": 0.0, "id": 1.0, "mixed": self.mix}

    def initial_model(self, data: Dataset, path: str, seed: int) -> None:
        """Train the tokenizer on tools + training queries, build the model, save it to ``path``."""
        texts = tool_texts(data.corpus, list(data.corpus), self.params.tool_fields)
        texts += [data.queries[q] for q in data.qrels["train"]]
        torch.manual_seed(seed)  # the ID head is initialised here, also on top of a hub backbone
        encoder = TextEncoder.from_spec(spec_from(self.params.encoder), texts, seed=seed)
        position = {t: i for i, t in enumerate(data.corpus)}
        train_tools = sorted(
            {t for rel in data.qrels["train"].values() for t in rel}, key=position.__getitem__
        )
        BiEncoder(encoder, train_tools if self.params.id_head else None).save(path)

    def loop_config(self, init_dir: str, dataset: Dataset | ray.ObjectRef) -> dict[str, Any]:
        """What the generic training loop reads (lr, epochs, batch size at the top level) and the task."""
        params = asdict(self.params)
        return {**params, "params": params, "init_dir": init_dir, "dataset": dataset}

    def fit(self, stage: str, data: Dataset, run: RunSpec) -> dict[str, float]:
        """Run the contrastive stage on Ray Train, keep the best checkpoint, select ``mix`` on valid."""
        from components.training.runner import run_stage

        init_dir = os.path.join(os.path.abspath(run.local_dir), f"{run.name}-init")
        self.initial_model(data, init_dir, run.seed)
        loop = self.loop_config(share(init_dir, run, f"{run.name}-init"), ray.put(data))
        result = run_stage(self.name, stage, loop, run, score=f"valid_{self.params.select_metric}")
        self.model = BiEncoder.load(result.model_dir)
        self.select_mix(data)
        return {**result.metrics, "mix": self.mix, "stage_seconds": result.seconds}

    def select_mix(self, data: Dataset) -> None:
        """Pick the text/ID mixing weight on valid (never test)."""
        if self.model is None or self.model.id_embeddings is None:
            self.mix = 0.0
            return
        self.index(data.corpus)
        queries = data.split_queries("valid")
        best = (-1.0, self.mix)
        for mix in self.params.mix_grid:
            self.mix = mix
            value = evaluate_retrieval(data.qrels["valid"], self.retrieve(queries, 10))[
                self.params.select_metric
            ]
            best = max(best, (value, mix))
        self.mix = best[1]

    def index(self, corpus: Corpus) -> None:
        """Embed every tool's text; align the ID table (NaN rows for tools it has no vector for)."""
        if self.model is None:
            raise RuntimeError("dense: train (fit) or load a model before indexing")
        self.tool_ids = list(corpus)
        texts = tool_texts(corpus, self.tool_ids, self.params.tool_fields)
        self._tools = self.model.embed_texts(texts, self.params.tool_max_length)
        self.index_ids()

    def retrieve(self, queries: Queries, k: int) -> Results:
        if self.model is None or self._tools is None:
            raise RuntimeError("dense: call index() before retrieve()")
        qids = list(queries)
        matrix = combined_tools(self._tools, self._ids, self.mix)
        search = self._faiss_search(matrix) if self.params.index_backend == "faiss" else None
        out: Results = {}
        for i in range(0, len(qids), 1024):
            chunk = qids[i : i + 1024]
            q = self.model.embed_texts([queries[x] for x in chunk])
            if search is None:
                out |= top_k(q @ matrix.T, chunk, self.tool_ids, k)
            else:
                values, index = search(q, min(k, len(self.tool_ids)))
                out |= {
                    qid: {
                        self.tool_ids[j]: float(v) for v, j in zip(values[r], index[r], strict=True) if j >= 0
                    }
                    for r, qid in enumerate(chunk)
                }
        return out

    def _faiss_search(
        self, matrix: torch.Tensor
    ) -> Callable[[torch.Tensor, int], tuple[np.ndarray, np.ndarray]]:
        """An exact inner-product FAISS index over ``matrix`` (install the ``faiss`` extra)."""
        try:
            import faiss
        except ImportError as e:
            raise RuntimeError("index_backend=faiss needs faiss-cpu: pip install 'toolscout[faiss]'") from e
        index = faiss.IndexFlatIP(matrix.shape[1])
        index.add(matrix.numpy().astype(np.float32))
        return lambda q, k: index.search(q.numpy().astype(np.float32), k)

    def save(self, path: str) -> None:
        """``config.json`` + the bi-encoder (HF encoder, safetensors heads) + the tool index (.npy)."""
        if self.model is None or self._tools is None:
            raise RuntimeError("dense: nothing to save; fit/load and index first")
        write_config(path, {"method": self.name, **self.config(), "tool_ids": self.tool_ids})
        self.model.save(os.path.join(path, "model"))
        np.save(os.path.join(path, "tool_embeddings.npy"), self._tools.numpy())

    @classmethod
    def load(cls, path: str) -> DenseMethod:
        config = read_config(path)
        tool_ids, mix = config.pop("tool_ids"), config.pop("mix")
        config.pop("method")
        config = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
        method = cls(**config)
        method.model = BiEncoder.load(os.path.join(path, "model"))
        method.mix = mix
        method.tool_ids = tool_ids
        method._tools = torch.from_numpy(np.load(os.path.join(path, "tool_embeddings.npy")))
        method.index_ids()
        return method

    def index_ids(self) -> None:
        """Re-align the ID table to ``tool_ids`` (after load, without re-embedding tool texts)."""
        assert self.model is not None and self._tools is not None
        self._ids = None
        if self.model.id_embeddings is not None:
            # On the CPU, beside the tool vectors (in a GPU worker's validation the table is on the GPU).
            table = torch.nn.functional.normalize(self.model.id_embeddings.weight.detach(), dim=-1).cpu()
            row = {t: i for i, t in enumerate(self.model.id_tool_ids)}
            self._ids = torch.full_like(self._tools, float("nan"))
            known = [(j, row[t]) for j, t in enumerate(self.tool_ids) if t in row]
            if known:
                cols, rows = zip(*known, strict=True)
                self._ids[list(cols)] = table[list(rows)].to(self._ids.dtype)
