"""Tool codes from a trained RQ-VAE: assignment, collision rate, and the pass that makes codes unique.

Quantisation alone may give two tools the same full code (c_1, ..., c_L); a generated code must name
one tool, so after assignment every group of tools sharing a code keeps its best-fitting member
and moves the others to the nearest free address: another last-level code under the same prefix,
else (when all K are taken) the nearest code one level up with a free last-level code. New
tools (cold start) are assigned the same way against the codes already taken.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

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


def shared_codes(codes: np.ndarray) -> np.ndarray:
    """Per row of ``codes``: whether another row has the same full code."""
    if len(codes) == 0:
        return np.zeros(0, dtype=bool)
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    return counts[inverse.reshape(-1)] > 1


def collision_rate(codes: np.ndarray) -> float:
    """Share of tools whose full code is also another tool's."""
    return float(shared_codes(codes).mean()) if len(codes) else 0.0


def collided(codes: np.ndarray, taken: Iterable[tuple[int, ...]] = ()) -> int:
    """How many of ``codes`` are in ``taken`` or another row's too (each row counted once, as
    :func:`collision_rate` counts): the tools the collision pass has to look at."""
    used = {tuple(int(c) for c in code) for code in taken}
    in_use = [tuple(int(c) for c in code) in used for code in codes]
    return int((shared_codes(codes) | np.asarray(in_use, dtype=bool)).sum())


def _free(prefix: tuple[int, ...], order: list[int], used: set[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The first code ``(*prefix, c)``, ``c`` taken in ``order``, that no tool uses yet."""
    return next(((*prefix, c) for c in order if (*prefix, c) not in used), None)


def _nearest_free(
    model: RQVAE,
    residual: torch.Tensor,
    prefix: tuple[int, ...],
    used: set[tuple[int, ...]],
    limit: int | None = None,
) -> tuple[int, ...] | None:
    """The first unused full code below ``prefix`` in a depth-first walk that takes each level's
    codes nearest ``residual`` (what that level has left to quantise) first; ``limit`` keeps only
    the nearest codes at this level. None when every code below ``prefix`` is in use."""
    level = len(prefix)
    order = squared_distances(residual[None], model.codebooks[level]).argsort(1)[0][:limit].tolist()
    if level == model.config.levels - 1:
        return _free(prefix, order, used)
    for c in order:
        found = _nearest_free(model, residual - model.codebooks[level][c], (*prefix, c), used)
        if found is not None:
            return found
    return None


@torch.no_grad()
def resolve_collisions(
    model: RQVAE,
    vectors: np.ndarray,
    codes: np.ndarray,
    taken: Iterable[tuple[int, ...]] = (),
    fallback_prefixes: int | None = None,
    names: Sequence[str] | None = None,
) -> np.ndarray:
    """``codes`` with every full code unique (also against ``taken``, the codes already in use).

    In each group sharing a code the tool nearest its last-level code keeps it; the others, and
    any tool whose code is in ``taken``, move to their nearest free last-level code under the same
    prefix, else under the nearest code of the level above that has a free one (the
    ``fallback_prefixes`` nearest, or all of them by default), else, changing ever higher levels,
    to the nearest free code below the longest prefix of their own that still has one: while the
    catalog fits in the K^L addresses every tool finds one.

    Args:
        names: The tools' ids, row by row, for the error (else their row numbers).

    Raises:
        ValueError: A tool found no free address (more tools than addresses).
    """
    codes = codes.copy()
    if len(codes) == 0:
        return codes
    x = torch.as_tensor(vectors, dtype=torch.float32)
    residuals = model.residuals(x, torch.as_tensor(codes, dtype=torch.long))
    last = residuals[-1]
    fit = squared_distances(last, model.codebooks[-1]).gather(1, torch.as_tensor(codes[:, -1:])).squeeze(1)
    used = {tuple(int(c) for c in code) for code in taken}
    in_use = len(used)
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
        new = None
        for level in range(levels - 1, -1, -1):  # keep as long a prefix of the tool's own code as can be
            prefix = tuple(int(c) for c in codes[i, :level])
            limit = fallback_prefixes if level == levels - 2 else None
            new = _nearest_free(model, residuals[level][i], prefix, used, limit)
            if new is None and limit is not None and level == 0:
                # With two levels the limited search is the top one: nothing above to fall back to.
                new = _nearest_free(model, residuals[level][i], prefix, used, None)
            if new is not None:
                break
        if new is None:
            tool = f"tool {names[i]!r}" if names is not None else f"tool row {i}"
            raise ValueError(
                f"no free code for {tool}: every one of the {model.config.codebook_size}^{levels} "
                f"addresses is in use ({in_use} already taken + {len(codes)} coded here); "
                "raise codebook_size or levels"
            )
        used.add(new)
        codes[i] = new
    return codes
