"""Result tables (markdown) and the Recall@K plot written next to benchmark JSON."""

from __future__ import annotations

import io as io_bytes
import json
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

from components.config import is_number
from components.data import io

COLUMNS = (
    "recall@1",
    "recall@3",
    "recall@5",
    "ndcg@1",
    "ndcg@3",
    "ndcg@5",
    "comp@3",
    "comp@5",
    "detect_accuracy",
    "detect_f1",
    "detect_auroc",
    "hallucination_rate",
)


def md_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a markdown table: header, separator, one line per row of cells."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(row) + " |" for row in rows
    ]


def metrics_table(rows: list[dict[str, Any]], labels: Sequence[str], columns: Sequence[str]) -> str:
    """A markdown table of result rows: the ``labels`` fields of each, then its ``metrics`` columns,
    4 decimals for ranking metrics (``recall@3``), 2 for the rest (milliseconds, megabytes)."""

    def cell(name: str, value: float) -> str:
        return f"{value:.4f}" if "@" in name else f"{value:.2f}"

    body = [[*(str(r[k]) for k in labels), *(cell(c, r["metrics"][c]) for c in columns)] for r in rows]
    return "\n".join(md_table([*labels, *columns], body)) + "\n"


def markdown_table(report: dict[str, Any], columns: tuple[str, ...] = COLUMNS) -> str:
    """A markdown table with one row per (method, split) and the chosen metric columns."""
    present = [c for c in columns if any(c in r["metrics"] for r in report["results"])]
    extra = [
        c
        for c in ("train_seconds", "eval_seconds", "peak_memory_mb", "device")
        if any(c in r for r in report["results"])
    ]
    rows = [
        [
            r["method"],
            r["split"],
            *(f"{r['metrics'][c]:.4f}" if c in r["metrics"] else "" for c in present),
            *(extra_cell(r.get(c)) for c in extra),
        ]
        for r in report["results"]
    ]
    return "\n".join(md_table(["method", "split", *present, *extra], rows)) + "\n"


def extra_cell(value: Any) -> str:
    """A non-metric column's cell: seconds and MiB to one decimal, names as they are, blank if absent."""
    if value is None:
        return ""
    return f"{value:.1f}" if isinstance(value, float | int) else str(value)


def recall_plot(
    report: dict[str, Any], path: str, split: str = "test", storage_options: dict[str, Any] | None = None
) -> None:
    """Recall@K against K for each method on ``split``, saved as PNG (``storage_options`` for s3://)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = [r["split"] for r in report["results"]]
    if split not in splits and splits:
        split = splits[-1]  # test not evaluated (evaluate.splits: [valid]): plot what was
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in report["results"]:
        if r["split"] != split:
            continue
        ks = sorted(int(k.split("@")[1]) for k in r["metrics"] if k.startswith("recall@"))
        ax.plot(ks, [r["metrics"][f"recall@{k}"] for k in ks], marker="o", label=r["method"])
    ax.set_xlabel("K")
    ax.set_ylabel(f"Recall@K ({split})")
    ax.set_title(report["dataset"])
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    buffer = io_bytes.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    io.write_bytes(path, buffer.getvalue(), storage_options)


def strict_json(value: Any) -> bytes:
    """``value`` as indented JSON bytes, a NaN or infinite float written as null (:func:`finite`):
    the one way results, reports and records are written."""
    return json.dumps(finite(value), indent=2, allow_nan=False).encode()


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by ``None`` (JSON's null), at any depth."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def contract_rows(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` as the results contract has it: each row's ``metrics`` maps lowercase names to
    numbers (or null); a value that is not a number (the versions that answered a load, the p99 of
    each repeated run) goes to the row's ``detail`` instead, where tables can still read it.

    Raises:
        ValueError: a metric name with capitals (``R@3`` where readers look for ``recall@3``).
    """
    rows = []
    for row in report.get("results") or []:
        metrics, detail = {}, dict(row.get("detail") or {})
        for name, value in (row.get("metrics") or {}).items():
            if name != name.lower():
                raise ValueError(f"metric names are lowercase (recall@3, p50_ms); got {name!r}")
            (metrics if value is None or is_number(value) else detail)[name] = value
        rows.append({**row, "metrics": metrics, **({"detail": detail} if detail else {})})
    return {**report, "results": rows} if "results" in report else report


def write_report(
    report: dict[str, Any],
    out_json: str,
    title: str = "",
    plot: bool = True,
    table: str | Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Write ``out_json``, the ``.md`` beside it and (optionally) the ``.png`` plot.

    ``out_json`` is a local path or an ``s3://`` URL (a job submitted to a cluster runs in a
    temporary copy of the working directory, so its results belong on shared storage), reached with
    ``storage_options`` (an endpoint, keys) when given.
    The ``.md`` is the title, ``report["notes"]`` and ``table``: by default :func:`markdown_table`,
    or a benchmark's own markdown (other columns, several tables), as text or as lines (e.g. from
    :func:`md_table`).
    """
    # Strict JSON: a metric that has no value (a first round's champion) is null, not NaN, which
    # Python writes and other readers (jq, JavaScript, a strict parser) refuse.
    io.write_bytes(out_json, strict_json(contract_rows(report)), storage_options)
    stem = os.path.splitext(out_json)[0]
    header = f"# {title or report['dataset']}\n\n" + report.get("notes", "") + "\n"
    if table is None:
        table = markdown_table(report)
    elif not isinstance(table, str):
        table = "\n".join(table) + "\n"
    markdown = header + "\n" + table
    io.write_bytes(stem + ".md", markdown.encode(), storage_options)
    written = [out_json, stem + ".md"]
    if plot:
        recall_plot(report, stem + ".png", storage_options=storage_options)
        written.append(stem + ".png")
    return written
