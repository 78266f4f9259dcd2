"""Tool codes from a trained RQ-VAE: assignment, collision rate, and the pass that makes codes unique.

Quantisation alone may give two tools the same full code (c_1, ..., c_L); a generated code must name
one tool, so after assignment every group of tools sharing a code keeps its best-fitting member
and moves the others to the nearest free address: another last-level code under the same prefix,
else (when all K are taken) the nearest code one level up with a free last-level code. New
tools (cold start) are assigned the same way against the codes already taken.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import torch

from components.methods.toolweaver.model import RQVAE, squared_distances


@torch.no_grad()
def assign(
    model: RQVAE, vectors: np.ndarray, sinkhorn_epsilon: float = 0.0, sinkhorn_iters: int = 50
) -> np.ndarray:
    """Codes (N × L) of all ``vectors`` at once (Sinkhorn balances over the whole catalog)."""
    model.eval()
    x = torch.as_tensor(vectors, dtype=torch.float32)
    codes, _, _ = model.quantize(model.latent(x), sinkhorn_epsilon, sinkhorn_iters)
    return codes.numpy()


def collision_rate(codes: np.ndarray) -> float:
    """Share of tools whose full code is also another tool's."""
    if len(codes) == 0:
        return 0.0
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    return float((counts[inverse.reshape(-1)] > 1).mean())


def _last_level_order(model: RQVAE, residual: torch.Tensor) -> list[int]:
    return squared_distances(residual[None], model.codebooks[-1]).argsort(1)[0].tolist()


def _free(prefix: tuple[int, ...], order: list[int], used: set[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The first code ``(*prefix, c)`` for ``c`` in ``order`` that no tool uses yet."""
    return next(((*prefix, c) for c in order if (*prefix, c) not in used), None)


def _free(prefix: tuple[int, ...], order: list[int], used: set[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The first code ``(*prefix, c)``, ``c`` taken in ``order``, that no tool uses yet."""
    return next(((*prefix, c) for c in order if (*prefix, c) not in used), None)


@torch.no_grad()
def resolve_collisions(
    model: RQVAE,
    vectors: np.ndarray,
    codes: np.ndarray,
    taken: Iterable[tuple[int, ...]] = (),
    fallback_prefixes: int | None = None,
) -> np.ndarray:
    """``codes`` with every full code unique (also against ``taken``, the codes already in use).

    In each group sharing a code the tool nearest its last-level code keeps it; the others, and
    any tool whose code is in ``taken``, move to their nearest free last-level code under the same
    prefix, else under the nearest code of the level above that has a free one (the
    ``fallback_prefixes`` nearest, or all of them by default).

    Raises:
        ValueError: A tool found no free address (the codebooks are too small for the catalog).
    """
    codes = codes.copy()
    if len(codes) == 0:
        return codes
    x = torch.as_tensor(vectors, dtype=torch.float32)
    residuals = model.residuals(x, torch.as_tensor(codes, dtype=torch.long))
    last = residuals[-1]
    fit = squared_distances(last, model.codebooks[-1]).gather(1, torch.as_tensor(codes[:, -1:])).squeeze(1)
    used = {tuple(int(c) for c in code) for code in taken}
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, code in enumerate(codes):
        groups[tuple(int(c) for c in code)].append(i)
    movers = []
    for code, members in groups.items():
        members.sort(key=lambda i: float(fit[i]))
        if code in used:
            movers += members
        else:
            used.add(code)
            movers += members[1:]
    levels = model.config.levels
    for i in sorted(movers, key=lambda i: float(fit[i])):
        prefix = tuple(int(c) for c in codes[i, :-1])
        new = _free(prefix, _last_level_order(model, last[i]), used)
        if new is None and levels > 1:
            above = residuals[-2][i]
            for alt in squared_distances(above[None], model.codebooks[-2]).argsort(1)[0][:fallback_prefixes]:
                residual = above - model.codebooks[-2][int(alt)]
                new = _free((*prefix[:-1], int(alt)), _last_level_order(model, residual), used)
                if new is not None:
                    break
        if new is None:
            raise ValueError(
                f"no free code for tool row {i}: {len(codes)} tools in {model.config.codebook_size}^"
                f"{levels} addresses are too crowded near it; raise codebook_size or levels"
            )
        used.add(new)
        codes[i] = new
    return codes
