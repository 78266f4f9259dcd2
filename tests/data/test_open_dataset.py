"""``dataset_from_config`` applies every ``data.*`` setting to raw directories too."""

from __future__ import annotations

import pytest
from conftest import write_tiny_dataset

from components.data import dataset_from_config
from components.data.rejects import StrictModeError


def test_strict_name_and_splits_reach_a_raw_directory(tmp_path, capsys):
    data = write_tiny_dataset(tmp_path / "d", bad_rows=True)
    with pytest.raises(StrictModeError, match=r"corpus\.jsonl:5"):
        dataset_from_config({"data": {"path": str(data), "strict": True}})
    ds = dataset_from_config({"data": {"path": str(data), "name": "mine", "splits": ["train"]}})
    assert ds.name == "mine" and "test" not in ds.qrels and ds.qrels["valid"]
    captured = capsys.readouterr()
    # The warning goes to stderr: `toolscout evaluate` prints its table on stdout.
    assert "row(s) rejected" in captured.err and "row(s) rejected" not in captured.out
