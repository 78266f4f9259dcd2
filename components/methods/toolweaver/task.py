"""ToolWeaver's quantizer stage (``codes``), built inside each Ray Train worker.

The driver writes the stage's inputs to one directory every worker reads (``init_dir``): the tool
vectors (``vectors.npy``, rows in ``tools.json`` order) and the normalised tool–tool co-occurrence
matrix (``cooccurrence.npz``, same order). The task trains the collaborative RQ-VAE on them; its
LM stages are the shared :class:`components.generative.task.CodeLMTask`.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp
import torch

from components.data import io
from components.methods.toolweaver.codes import collision_rate
from components.methods.toolweaver.model import RQVAE, QuantizerConfig, collaborative_loss
from components.methods.toolweaver.params import ToolWeaverParams
from components.training.spec import StageConfig
from components.training.task import StageTask

VECTORS = "vectors.npy"
COOCCURRENCE = "cooccurrence.npz"
TOOLS = "tools.json"


def first_level_sharing(codes: np.ndarray, weights: sp.csr_matrix) -> float:
    """Weighted share of co-used tool pairs (A_uv > 0, u ≠ v) whose first-level codes agree.

    A pair weighs (A_uv + A_vu) / 2: the row normalisation (D^-1 A) is not symmetric, and the upper
    triangle alone weighed each pair by whichever of its tools came first in catalog order."""
    coo = sp.triu((weights + weights.T) / 2, k=1).tocoo()
    if coo.nnz == 0:
        return 0.0
    same = codes[coo.row, 0] == codes[coo.col, 0]
    return float((coo.data * same).sum() / coo.data.sum())


class QuantizerTask(StageTask):
    """Trains the RQ-VAE: reconstruction + codebook/commitment + λ · collaborative loss."""

    def __init__(self, config: StageConfig) -> None:
        self.config = config
        self.params: ToolWeaverParams = config.params
        assert config.inputs.init_dir is not None, "the codes stage reads the driver's tool vectors"
        source = io.fetch(config.inputs.init_dir, config.storage_options)
        self.vectors = torch.as_tensor(np.load(os.path.join(source, VECTORS)), dtype=torch.float32)
        self.weights = sp.load_npz(os.path.join(source, COOCCURRENCE)).tocsr()

    def build_model(self) -> RQVAE:
        p = self.params
        torch.manual_seed(int(self.config.seed))
        model = RQVAE(
            QuantizerConfig(
                input_dim=int(self.vectors.shape[1]),
                hidden_dims=p.hidden_dims,
                latent_dim=p.latent_dim,
                levels=p.levels,
                codebook_size=p.codebook_size,
                beta=p.beta,
            )
        )
        model.fit_scaling(self.vectors)
        # The paper's k-means initialisation on the first batch; seeded, so every DDP worker
        # computes the same codebooks. At least K rows: k-means on fewer than K has empty clusters,
        # reset to copies of data rows that the tie-break never picks (codes dead from the start).
        generator = torch.Generator().manual_seed(int(self.config.seed))
        rows = max(int(self.config.batch_size), p.codebook_size)
        first = torch.randperm(len(self.vectors), generator=generator)[:rows]
        model.init_codebooks(self.vectors[first], p.kmeans_iters, int(self.config.seed))
        return model

    def train_data(self) -> list[int]:
        return list(range(len(self.vectors))) * max(1, self.params.passes_per_epoch)

    def collate(self, items: list[int]) -> dict[str, torch.Tensor]:
        rows = np.asarray(items)
        block = self.weights[rows][:, rows].toarray()
        np.fill_diagonal(block, 0.0)  # a tool repeated in a batch is not its own co-user
        return {
            "x": self.vectors[rows],
            "weights": torch.as_tensor(block, dtype=torch.float32),
            "ids": torch.as_tensor(rows),  # a tool repeated in the batch is balanced once
        }

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        p = self.params
        out = model(batch["x"], p.sinkhorn_epsilon, p.sinkhorn_iters, batch.get("ids"))
        loss = out["reconstruction_loss"] + out["quantiser_loss"]
        if p.collab_weight > 0:
            collab = collaborative_loss(out["z_hat"], batch["weights"])
            rows, tools = len(batch["x"]), len(self.vectors)
            if p.collab_scale == "catalog" and rows > 1:
                # A batch sees (B − 1)/(N − 1) of each tool's co-users on average: undone here. Also
                # when B >= N: the catalogue repeats in a batch then, and its term is about
                # (B − 1)/(N − 1) times the per-tool one (2.5x at 100 tools and batches of 256).
                collab = collab * (tools - 1) / (rows - 1)
            loss = loss + p.collab_weight * collab
        return loss

    @torch.no_grad()
    def validate(self, model: torch.nn.Module) -> dict[str, float]:
        """Losses and code statistics over the whole catalog (the tools are the training data and
        there is no held-out tool; test is never read here). Ranked by reconstruction."""
        p = self.params
        device = next(model.parameters()).device  # the worker's GPU, where there is one
        out = model(self.vectors.to(device), p.sinkhorn_epsilon, p.sinkhorn_iters)
        codes = out["codes"].cpu().numpy()
        reconstruction = float(out["reconstruction_loss"])
        return {
            "reconstruction": reconstruction,
            "quantiser": float(out["quantiser_loss"]),
            "collision_rate": collision_rate(codes),
            "first_level_codes_used": float(len(np.unique(codes[:, 0]))),
            "co_used_first_level_shared": first_level_sharing(codes, self.weights),
            "score": -reconstruction,
        }

    def save_model(self, model: torch.nn.Module, path: str) -> None:
        model.save(path)
