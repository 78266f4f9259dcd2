"""The Serve A/B benchmark's summary: medians over every run of a variant, ratios to the baseline."""

from __future__ import annotations

import pytest

from benchmarks.serve_env_ab import markdown, median_of, summarize


def _run(p50: float, p99: float, errors: int = 0) -> dict:
    return {"p50_ms": p50, "p99_ms": p99, "rps": 120.0, "errors": errors, "requests": 1200}


def test_median_over_runs_sums_errors_and_requests():
    m = median_of([_run(10, 90), _run(8, 40), _run(9, 50, errors=2)])
    assert (m["p50_ms"], m["p99_ms"], m["rps"]) == (9, 50, 120.0)
    assert m["errors"] == 2 and m["requests"] == 3600


def test_summary_ratio_is_each_variants_median_p99_over_the_baselines():
    runs = {
        "baseline": {"120.0": [_run(10, 60), _run(10, 70), _run(10, 80)]},
        "candidate": {"120.0": [_run(8, 30), _run(8, 35), _run(8, 40), _run(8, 100)]},
    }
    rows = summarize(runs, {"baseline": "1", "candidate": "0"}, "RAY_x")
    by = {r["config"]["variant"]: r for r in rows}
    assert by["baseline"]["metrics"]["ratio"] == 1.0
    assert by["candidate"]["metrics"]["ratio"] == pytest.approx(37.5 / 70)  # median of 4 runs: 37.5
    assert by["candidate"]["config"] == {"variant": "candidate", "RAY_x": "0", "rate": 120.0, "runs": 4}
    assert by["candidate"]["metrics"]["p99_ms_runs"] == [30, 35, 40, 100]
    table = markdown(rows)
    assert "| candidate | RAY_x=0 | 120 | 4 | 8.0 | 37.5 | 30, 35, 40, 100 | 120 | 0 | 0.54 |" in table
