"""The training-curves report: Ray Train's per-run checkpoint snapshots as valid rows per epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.train_curves import epoch_rows, stage_runs, table


def write_snapshot(root: Path, run: str, epochs: list[dict[str, float]], stamp: str) -> Path:
    """A run directory as Ray Train 2.60 leaves it: checkpoint dirs named by time, their metrics."""
    results = [
        {"checkpoint_dir_name": f"checkpoint_{stamp}.{i:06d}", "metrics": {"epoch": i, **m}}
        for i, m in enumerate(epochs)
    ]
    path = root / run / "checkpoint_manager_snapshot.json"
    path.parent.mkdir(parents=True)
    # Ray writes the snapshot in report order; shuffle it to show the rows are sorted by epoch.
    path.write_text(json.dumps({"ray_version": "2.60.0", "checkpoint_results": results[::-1]}))
    return path


def test_stages_come_in_training_order_and_rows_drop_the_valid_prefix(tmp_path):
    # "retrieval" sorts after "memorization" by name but trained first here: time decides.
    write_snapshot(tmp_path, "tl-x-retrieval", [{"valid_ndcg@3": 0.5, "epoch_seconds": 3.0}], "2026-01-01_10")
    write_snapshot(
        tmp_path,
        "tl-x-memorization",
        [
            {"valid_memorization_acc": 0.4, "train_loss": 2.0},
            {"valid_memorization_acc": 0.9, "train_loss": 1.0},
        ],
        "2026-01-01_11",
    )
    write_snapshot(tmp_path, "tl-other-agent", [{"valid_ndcg@3": 0.1}], "2026-01-01_09")  # another run
    stages = stage_runs(str(tmp_path), "tl-x")
    assert list(stages) == ["retrieval", "memorization"]
    rows = [row for stage, path in stages.items() for row in epoch_rows("m", stage, path)]
    assert [(r["config"]["stage"], r["config"]["epoch"]) for r in rows] == [
        ("retrieval", 1),
        ("memorization", 1),
        ("memorization", 2),
    ]
    assert rows[0]["metrics"] == {"ndcg@3": 0.5, "epoch_seconds": 3.0}
    assert rows[2]["metrics"] == {"memorization_acc": 0.9, "train_loss": 1.0}
    assert all(r["split"] == "valid" and r["method"] == "m" for r in rows)
    lines = table(rows).splitlines()
    assert lines[0] == "| stage | epoch | ndcg@3 | memorization_acc | train_loss | epoch_seconds |"
    assert lines[2] == "| retrieval | 1 | 0.5000 |  |  | 3.0 |"


def test_a_run_name_with_no_stage_directories_is_a_clear_error(tmp_path):
    write_snapshot(tmp_path, "tl-x-retrieval", [{"valid_ndcg@3": 0.5}], "2026-01-01_10")
    with pytest.raises(SystemExit, match="no tl-y-<stage>"):
        stage_runs(str(tmp_path), "tl-y")
