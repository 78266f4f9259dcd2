"""Local paths given as ``file://`` URLs work like plain paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from components.data import io
from components.data.graphs import IdMap, load_sparse, save_sparse


def test_file_urls_write_where_they_point(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a wrong implementation would create ./file:/... here
    target = tmp_path / "out"
    url = f"file://{target}"
    io.makedirs(io.join(url, "graphs"))
    io.write_bytes(io.join(url, "a", "b.txt"), b"hello")
    assert (target / "a" / "b.txt").read_bytes() == b"hello"
    assert io.read_bytes(io.join(url, "a", "b.txt")) == b"hello"
    matrix = sp.csr_matrix(np.eye(2, dtype=np.float32))
    save_sparse(io.join(url, "graphs", "g"), matrix, IdMap.of(["1", "0"]), IdMap.of(["x", "y"]))
    loaded, rows, _ = load_sparse(str(target / "graphs" / "g"))
    assert (loaded != matrix).nnz == 0 and rows.ids == ("0", "1")
    assert not (tmp_path / "file:").exists()


def test_remove_deletes_a_tree_and_ignores_a_missing_path(tmp_path: Path) -> None:
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "sub" / "f").write_text("x")
    io.remove(str(tmp_path / "t"))
    io.remove(str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_put_dir_copies_a_source_whose_name_reads_as_a_pattern(tmp_path: Path) -> None:
    # fsspec's recursive put globbed "run[1]" and copied its sibling "run1" instead, silently.
    for name, file in (("run[1]", "model.bin"), ("run1", "other.bin")):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / file).write_bytes(name.encode())
    (tmp_path / "run[1]" / "empty").mkdir()
    dst = tmp_path / "dst"
    (dst / "stale").mkdir(parents=True)
    io.put_dir(str(tmp_path / "run[1]"), str(dst))
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*")) == ["empty", "sub", "sub/model.bin"]
    assert (dst / "sub" / "model.bin").read_bytes() == b"run[1]"


def test_id_map_orders_integer_ids_numerically_and_other_digits_lexically() -> None:
    assert IdMap.of(["10", "9", "007", "7"]).ids == ("007", "7", "9", "10")
    assert IdMap.of(["2", "²"]).ids == ("2", "²")  # "²".isdigit() is True, but int("²") fails


def test_an_endpoint_in_the_options_wins_over_aws_endpoint_url(monkeypatch):
    from components.data.io import storage_options_for

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    assert storage_options_for("s3://b/x") == {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    # s3fs's own endpoint_url option: adding client_kwargs' too made s3fs fail with a TypeError.
    given = {"endpoint_url": "http://127.0.0.1:5078"}
    assert storage_options_for("s3://b/x", given) == given


def test_json_lines_keep_unicode_line_separators_and_bad_lines_are_named(tmp_path: Path) -> None:
    path = str(tmp_path / "rows.jsonl")
    rows = [{"content": "a\u2028b"}, {"content": "c\u0085d"}, {"content": "plain"}]
    io.write_jsonl(path, rows)  # non-ASCII written as is, U+2028 and U+0085 included
    assert io.read_jsonl(path) == rows
    (tmp_path / "rows.jsonl").write_text('{"ok": 1}\n{"broken": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"rows\.jsonl, line 2: expected a JSON object"):
        io.read_jsonl(path)
