"""The results files' contract: ``{"dataset", "results": [{"method", "config", "split", "metrics"}]}``
with lowercase metric names and numbers (or null) as metric values, in what the writer writes and
in every committed file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflows.report import contract_rows, write_report

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_the_writer_moves_values_that_are_not_numbers_out_of_the_metrics(tmp_path):
    # serve_load wrote the versions that answered and each repeated run's p99 as metrics (lists),
    # where a reader of the contract expects numbers.
    row = {"method": "serve", "config": {}, "split": "test"}
    metrics = {"p50_ms": 7.4, "errors": 0, "rps": None, "versions": ["bm25/v1"], "p99_ms_runs": [30.1, 31.0]}
    report = {"dataset": "toollens", "results": [{**row, "metrics": metrics}]}
    write_report(report, str(tmp_path / "r.json"), plot=False, table="")
    (written,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert written["metrics"] == {"p50_ms": 7.4, "errors": 0, "rps": None}
    assert written["detail"] == {"versions": ["bm25/v1"], "p99_ms_runs": [30.1, 31.0]}
    assert report["results"][0]["metrics"] == metrics  # the caller's rows are left as they were
    with pytest.raises(ValueError, match="lowercase"):
        contract_rows({"results": [{**row, "metrics": {"R@3": 0.5}}]})


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_committed_results_file_keeps_the_contract(path):
    report = json.loads(path.read_text())
    assert isinstance(report.get("dataset"), str) and isinstance(report.get("results"), list)
    for row in report["results"]:
        assert {"method", "config", "split", "metrics"} <= set(row), row
        for name, value in row["metrics"].items():
            assert name == name.lower(), f"{path.name}: metric {name!r}"
            assert value is None or (isinstance(value, int | float) and not isinstance(value, bool)), (
                f"{path.name}: metric {name!r} is {value!r}"
            )
