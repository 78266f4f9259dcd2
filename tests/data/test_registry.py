"""Versioned artifact directories: unique versions under concurrency, LATEST, atomic publish."""

from __future__ import annotations

import os
import threading

from components.data.registry import LATEST, promote, reserve_version, resolve, versions
from workflows.train import run_spec


def test_concurrent_trainers_never_share_a_version(tmp_path):
    root = str(tmp_path / "dense")
    got: list[str] = []
    barrier = threading.Barrier(8)

    def take():
        barrier.wait()  # all pick "the next number" at the same moment
        got.append(reserve_version(root))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(os.path.basename(p) for p in got) == [f"v{i:04d}" for i in range(1, 9)]
    assert versions(root) == [f"v{i:04d}" for i in range(1, 9)]


def test_promote_points_latest_and_leaves_no_temp_files(tmp_path):
    root = tmp_path / "bm25"
    first, second = reserve_version(str(root)), reserve_version(str(root))
    for path in (first, second):
        (tmp_path / path / "config.json").write_text("{}")
    threads = [threading.Thread(target=promote, args=(p,)) for p in (first, second) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (root / LATEST).read_text().strip() in {"v0001", "v0002"}
    assert sorted(os.listdir(root)) == [LATEST, "v0001", "v0002"]
    assert resolve(str(root)) in {first, second}


def test_run_name_is_scoped_per_bench_entry_and_combo():
    cfg = {"train": {"run_name": "nightly"}}
    assert run_spec(cfg, "default-name", scope="masstool-0").name == "nightly-masstool-0"
    assert run_spec(cfg, "default-name", scope="masstool-1").name == "nightly-masstool-1"
    assert run_spec(cfg, "default-name").name == "nightly"
    assert run_spec({}, "default-name", scope="masstool-0").name == "default-name"
