"""MassTool's QC-GCN propagation on ToolLens's training graph: one sparse product per layer against
PyTorch Geometric's ``LGConv`` message passing, forward and backward, on this machine's CPUs.

MassTool (arXiv 2507.00487) propagates every training query and tool through the query–tool graph
in every joint-stage step (LightGCN, ``L`` layers, layer-mean readout), leaving out the batch's own
edges and dropping 10 % of the edge pairs. ``QCGCN.propagate`` multiplies by the normalised
adjacency D^-1/2 A D^-1/2 as one sparse CSR matrix (its backward is the same product: the matrix is
symmetric); the reference here is the layer it replaced, ``LGConv(normalize=True)`` over the
filtered edge list (gather the sources, scale, scatter-add into the targets). Both run in the same
process on the same inputs, alternating, and the table gives the median of each and their ratio.

    python benchmarks/qcgcn_step.py [--data ../shared/datasets/toollens] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch_geometric.nn import LGConv  # noqa: E402
from torch_geometric.utils import dropout_edge  # noqa: E402

from components.data import open_dataset  # noqa: E402
from components.methods.masstool.graph import QueryGraphs, build_graphs  # noqa: E402
from components.methods.masstool.layers import QCGCN, ModelConfig  # noqa: E402
from workflows.report import md_table, write_report  # noqa: E402

TOOLLENS = os.path.join(ROOT, "..", "shared", "datasets", "toollens")


def lgconv_propagate(
    conv: LGConv, cfg: ModelConfig, x: torch.Tensor, edges: torch.Tensor, hide: torch.Tensor
) -> torch.Tensor:
    """The replaced layer: the batch's edges filtered out, pairs dropped, then ``LGConv`` per layer."""
    edges = edges[:, ~torch.isin(edges, hide).any(0)]
    edges, _ = dropout_edge(edges, p=cfg.edge_dropout, force_undirected=True)
    out, h = x, x
    for _ in range(cfg.layers):
        h = conv(h, edges)
        out = out + h
    return out / (cfg.layers + 1)


def time_steps(step: Callable[[], None], steps: int) -> list[float]:
    """Milliseconds of each of ``steps`` calls, after two warm-up calls."""
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        times.append(1000 * (time.perf_counter() - started))
    return times


def measure(graphs: QueryGraphs, layers: int, dim: int, batch: int, steps: int) -> dict[str, list[float]]:
    """Per-step milliseconds of both propagations at ``L = layers``, alternating in three blocks."""
    cfg = ModelConfig(dim=dim, layers=layers, edge_dropout=0.1)
    gcn = QCGCN(graphs, dim, cfg).train()
    conv = LGConv(normalize=True)
    n = graphs.n_queries + graphs.n_tools
    x = torch.randn(n, dim, requires_grad=True)
    weights = torch.randn(n, dim)

    def sparse_step() -> None:
        hide = torch.randint(0, graphs.n_queries, (batch,))
        (gcn.propagate(x, gcn.tool_edges, hide) * weights).sum().backward()

    def lgconv_step() -> None:
        hide = torch.randint(0, graphs.n_queries, (batch,))
        (lgconv_propagate(conv, cfg, x, gcn.tool_edges, hide) * weights).sum().backward()

    times: dict[str, list[float]] = {"lgconv": [], "sparse": []}
    for _ in range(3):  # alternating, so drift on a shared machine hits both
        times["lgconv"] += time_steps(lgconv_step, steps // 3)
        times["sparse"] += time_steps(sparse_step, steps // 3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=TOOLLENS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256, help="training queries hidden per step")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "qcgcn_step.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    graphs = build_graphs(open_dataset(args.data))
    rows = []
    for layers in (1, 2, 3):
        times = measure(graphs, layers, args.dim, args.batch, args.steps)
        base = statistics.median(times["lgconv"])
        for method, ms in times.items():
            p50 = statistics.median(ms)
            config = {"layers": layers, "dim": args.dim, "hidden_queries": args.batch, "edge_dropout": 0.1}
            metrics = {"p50_ms": p50, "ratio": p50 / base}
            rows.append({"method": method, "config": config, "split": "train graph", "metrics": metrics})
            print(layers, method, f"{p50:.1f} ms", f"{p50 / base:.3f}", flush=True)
    edges = int(graphs.query_tool.shape[1])
    report = {
        "dataset": "toollens",
        "graph": {"queries": graphs.n_queries, "tools": graphs.n_tools, "edges": edges},
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "results": rows,
        "notes": (
            f"Run: `python benchmarks/qcgcn_step.py` on {os.cpu_count()} CPU cores "
            f"({torch.get_num_threads()} torch threads). One step: the query–tool view's propagation of "
            f"{graphs.n_queries:,} training queries and {graphs.n_tools} tools ({edges:,} edges, "
            f"both directions) at width {args.dim}, with {args.batch} random training queries' edges "
            "left out and 10% of the edge pairs dropped, and the backward of a weighted sum. "
            f"{args.steps // 3 * 3} steps of each, alternating in three blocks; p50 is their median, "
            "ratio is p50 over LGConv's p50 at the same L.\n"
        ),
    }
    table = md_table(
        ["L", "propagation", "p50 ms per step", "ratio to LGConv"],
        [
            [
                str(r["config"]["layers"]),
                r["method"],
                f"{r['metrics']['p50_ms']:.1f}",
                f"{r['metrics']['ratio']:.3f}",
            ]
            for r in rows
        ],
    )
    title = "MassTool QC-GCN: sparse-product propagation vs LGConv (forward + backward)"
    write_report(report, args.out, title=title, plot=False, table=table)


if __name__ == "__main__":
    main()
