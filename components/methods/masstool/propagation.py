"""LightGCN's propagation for MassTool's QC-GCN (arXiv 2507.00487) as sparse matrix products.

Each layer is ``Â x`` with Â = D^-1/2 A D^-1/2, the symmetric normalisation PyTorch Geometric's
``gcn_norm`` computes (and its ``LGConv`` applies edge by edge). One CSR product per layer replaces
LGConv's gather / scale / scatter-add over every directed edge, which was most of a joint-stage
step on ToolLens's training graph (benchmarks/results/qcgcn_step.md). Edges left out of a step (a
hidden query's, or a pair that edge dropout draws) keep their place in the matrix with weight 0,
so the sparsity layout is built once per edge set and only the weights change.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch_geometric.nn.conv.gcn_conv import gcn_norm


class SortedEdges:
    """An undirected edge index ordered by (target, source), with the CSR row pointers of that order
    and, for each directed edge, the id of its undirected pair (edge dropout drops pairs)."""

    def __init__(self, edges: torch.Tensor, n: int) -> None:
        self.source = edges.clone()  # what this layout was built from
        order = (edges[1] * n + edges[0]).argsort()
        self.edges = edges[:, order]
        self.crow = torch.zeros(n + 1, dtype=torch.long, device=edges.device)
        self.crow[1:] = torch.bincount(self.edges[1], minlength=n).cumsum(0)
        low, high = self.edges.min(0).values, self.edges.max(0).values
        pairs, self.pair = torch.unique(low * n + high, return_inverse=True)
        self.n_pairs = int(pairs.numel())


class SymmetricSpMM(torch.autograd.Function):
    """``adj @ x`` for a symmetric sparse ``adj`` that takes no gradient.

    The backward is ``adj @ grad`` (adjᵀ = adj). Torch's own backward of a CSR product builds the
    transpose every step, which made a LightGCN step on ToolLens's graph twice as slow on CPU.
    The product runs in fp32 (under bf16 autocast the input may be bf16; the graph is small), with
    autocast off: CPU autocast would cast the operands back to bf16, and the CPU's sparse CSR
    product has no bf16 kernel (``train.precision: bf16`` on a CPU run failed in its first step).
    """

    @staticmethod
    def forward(ctx: Any, adj: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.adj, ctx.dtype = adj, x.dtype
        with torch.autocast(x.device.type, enabled=False):
            return adj @ x.float()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        with torch.autocast(grad.device.type, enabled=False):
            return None, (ctx.adj @ grad.float()).to(ctx.dtype)


def normalized_adjacency(
    graph: SortedEdges, n: int, hide: torch.Tensor | None = None, dropout: float = 0.0
) -> torch.Tensor:
    """Â over ``graph``'s edges as a sparse CSR matrix (symmetric), with the edges of the ``hide``
    nodes and a ``dropout`` share of the edge pairs given weight 0."""
    device = graph.edges.device
    keep = torch.ones(graph.edges.shape[1], dtype=torch.bool, device=device)
    if hide is not None and hide.numel():
        hidden = torch.zeros(n, dtype=torch.bool, device=device)
        hidden[hide] = True
        keep &= ~(hidden[graph.edges[0]] | hidden[graph.edges[1]])
    if dropout > 0:
        # Both directions of an edge together: the normalisation takes degrees from incoming
        # edges, so dropping one direction alone would also silence the other end's messages.
        keep &= (torch.rand(graph.n_pairs, device=device) >= dropout)[graph.pair]
    _, weight = gcn_norm(graph.edges, keep.float(), n, add_self_loops=False)
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta", once per process
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(graph.crow, graph.edges[0], weight, (n, n))
