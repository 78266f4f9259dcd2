"""ToolWeaver's collaborative residual-quantised VAE (arXiv 2601.21947).

A tool vector x (its text embedded by a pretrained encoder) goes through an MLP encoder to a small
latent z; L codebooks of K vectors quantise z residually (level l picks the code nearest to what
levels < l left unexplained), so the tool's code is (c_1, ..., c_L) and its quantised latent ẑ is
the sum of the chosen code vectors; an MLP decoder maps ẑ back to x. The loss is

    ‖x − dec(ẑ)‖²  +  Σ_l ( ‖sg(r_l) − e_l‖² + β ‖r_l − sg(e_l)‖² )  +  λ Σ_uv A_uv ‖ẑ_u − ẑ_v‖²

(reconstruction, codebook and commitment terms, and the collaborative term over the normalised
tool–tool co-occurrence A, which pulls tools used together towards the same codes). Gradients pass
the quantiser straight through (ẑ = z + sg(q − z)). At the last level, Sinkhorn–Knopp balancing
replaces the nearest-code choice so that codes spread evenly over the K last-level slots.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import nn

from components.methods.toolweaver.balance import balanced_last_level

CONFIG = "quantizer.json"
WEIGHTS = "quantizer.safetensors"


@dataclass
class QuantizerConfig:
    """Sizes of the RQ-VAE (saved beside its weights)."""

    input_dim: int
    hidden_dims: tuple[int, ...]
    latent_dim: int
    levels: int
    codebook_size: int
    beta: float = 0.25


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def squared_distances(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """‖x_i − c_k‖² for every row and code (B × K)."""
    return (x * x).sum(1, keepdim=True) - 2 * x @ codebook.T + (codebook * codebook).sum(1)[None, :]


def kmeans(x: torch.Tensor, k: int, iters: int, generator: torch.Generator) -> torch.Tensor:
    """k centroids of ``x`` (Lloyd's algorithm from a seeded sample of rows).

    With fewer rows than ``k`` the rows repeat with a little noise, so every code starts near data.
    An empty cluster is re-seeded at a random row.
    """
    n = len(x)
    pick = torch.randperm(n, generator=generator)
    if n >= k:
        centroids = x[pick[:k]].clone()
    else:
        extra = x[torch.randint(n, (k - n,), generator=generator)]
        noise = 0.01 * x.std() * torch.randn(extra.shape, generator=generator).to(x.device)
        centroids = torch.cat([x[pick], extra + noise])
    for _ in range(iters):
        assign = squared_distances(x, centroids).argmin(1)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k)
        empty = counts == 0
        centroids = torch.where(empty[:, None], centroids, sums / counts.clamp_min(1)[:, None])
        if empty.any():
            centroids[empty] = x[torch.randint(n, (int(empty.sum()),), generator=generator)]
    return centroids


class RQVAE(nn.Module):
    """MLP encoder → L residual codebooks of K codes → MLP decoder (see module docstring)."""

    def __init__(self, config: QuantizerConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.encoder = mlp([c.input_dim, *c.hidden_dims, c.latent_dim])
        self.decoder = mlp([c.latent_dim, *reversed(c.hidden_dims), c.input_dim])
        self.codebooks = nn.Parameter(torch.randn(c.levels, c.codebook_size, c.latent_dim) * 0.01)
        # Input standardisation, fixed from the training vectors (see ``fit_scaling``).
        self.register_buffer("input_mean", torch.zeros(c.input_dim))
        self.register_buffer("input_scale", torch.ones(()))

    @torch.no_grad()
    def fit_scaling(self, x: torch.Tensor) -> None:
        """Centre the inputs and scale them to unit variance per coordinate on average.

        Sentence-encoder vectors are unit-length, so each of their 384 coordinates varies by ~0.05:
        the reconstruction error of predicting the mean vector is then ~0.0025 and the RQ-VAE
        collapses every tool onto one code (measured on the quickstart catalog). After scaling,
        predicting the mean costs 1.0 and the codes must carry the differences between tools.
        """
        self.input_mean.copy_(x.mean(0))
        self.input_scale.copy_((x - self.input_mean).std().clamp_min(1e-8))

    def standardise(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.input_mean) / self.input_scale

    @torch.no_grad()
    def init_codebooks(self, x: torch.Tensor, iters: int, seed: int) -> None:
        """k-means on the residuals of the first batch, level by level (the paper's initialisation)."""
        generator = torch.Generator().manual_seed(seed)
        residual = self.encoder(self.standardise(x))
        for level in range(self.config.levels):
            centroids = kmeans(residual, self.config.codebook_size, iters, generator)
            self.codebooks[level] = centroids
            residual = residual - centroids[squared_distances(residual, centroids).argmin(1)]

    def quantize(
        self,
        z: torch.Tensor,
        sinkhorn_epsilon: float = 0.0,
        sinkhorn_iters: int = 50,
        ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Residual quantisation of ``z``: ``(codes B×L, quantised latent B×D, codebook+commitment loss)``.

        The last level's choice is Sinkhorn-balanced when ``sinkhorn_epsilon`` > 0; ``ids`` (B,)
        names each row's tool, so that a tool repeated in a batch is balanced once
        (:func:`~components.methods.toolweaver.balance.balanced_last_level`).
        """
        residual, quantised = z, torch.zeros_like(z)
        codes, loss = [], z.new_zeros(())
        for level in range(self.config.levels):
            codebook = self.codebooks[level]
            distances = squared_distances(residual, codebook)
            if sinkhorn_epsilon > 0 and level == self.config.levels - 1 and len(z) > 1:
                index = balanced_last_level(distances.detach(), codes, sinkhorn_epsilon, sinkhorn_iters, ids)
            else:
                index = distances.argmin(1)
            chosen = codebook[index]
            loss = (
                loss
                + F.mse_loss(chosen, residual.detach())
                + self.config.beta * F.mse_loss(residual, chosen.detach())
            )
            quantised = quantised + chosen
            residual = residual - chosen.detach()
            codes.append(index)
        return torch.stack(codes, 1), quantised, loss

    def latent(self, x: torch.Tensor) -> torch.Tensor:
        """z for raw tool vectors ``x``."""
        return self.encoder(self.standardise(x))

    def forward(
        self,
        x: torch.Tensor,
        sinkhorn_epsilon: float = 0.0,
        sinkhorn_iters: int = 50,
        ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        x = self.standardise(x)
        z = self.encoder(x)
        codes, quantised, quantiser_loss = self.quantize(z, sinkhorn_epsilon, sinkhorn_iters, ids)
        z_hat = z + (quantised - z).detach()  # straight-through: the decoder's gradient reaches the encoder
        reconstruction = self.decoder(z_hat)
        return {
            "codes": codes,
            "z_hat": z_hat,
            "reconstruction_loss": F.mse_loss(reconstruction, x),
            "quantiser_loss": quantiser_loss,
        }

    @torch.no_grad()
    def residuals(self, x: torch.Tensor, codes: torch.Tensor) -> list[torch.Tensor]:
        """What each level had left to quantise, given the chosen ``codes`` (L tensors of B × D)."""
        residual, out = self.encoder(self.standardise(x)), []
        for level in range(self.config.levels):
            out.append(residual)
            residual = residual - self.codebooks[level][codes[:, level]]
        return out

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, CONFIG), "w") as f:
            json.dump(asdict(self.config), f)
        save_model(self, os.path.join(path, WEIGHTS))

    @classmethod
    def load(cls, path: str) -> RQVAE:
        with open(os.path.join(path, CONFIG)) as f:
            config = json.load(f)
        config["hidden_dims"] = tuple(config["hidden_dims"])
        model = cls(QuantizerConfig(**config))
        load_model(model, os.path.join(path, WEIGHTS))
        return model


def collaborative_loss(z_hat: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_uv A_uv ‖ẑ_u − ẑ_v‖² over a batch, per row (``weights``: the batch's block of A, B × B).

    Equals 2·tr(ẑᵀ L ẑ)/B for the graph Laplacian L of A: co-used tools are pulled together, most
    where they are used together most.
    """
    return (weights * squared_distances(z_hat, z_hat)).sum() / max(len(z_hat), 1)
