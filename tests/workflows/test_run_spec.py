"""The train section as a RunSpec: run names scoped per bench entry and combo."""

from __future__ import annotations

import re

import pytest

from components.config import ConfigError
from workflows.train import model_name, run_spec


def test_run_name_is_scoped_per_bench_entry_and_combo():
    cfg = {"train": {"run_name": "nightly"}}
    assert run_spec(cfg, "default-name", scope="masstool-0").name == "nightly-masstool-0"
    assert run_spec(cfg, "default-name", scope="masstool-1").name == "nightly-masstool-1"
    assert run_spec(cfg, "default-name").name == "nightly"
    assert run_spec({}, "default-name", scope="masstool-0").name == "default-name"


def test_model_names_default_to_dataset_and_method_in_registry_characters():
    assert model_name({"method": {"name": "dense"}}, "ToolLens v2") == "ToolLens-v2-dense"
    named = {"method": {"name": "dense"}, "registry": {"model_name": "prod-retriever"}}
    assert model_name(named, "toollens") == "prod-retriever"


def test_every_train_setting_reaches_the_run_and_unknown_ones_are_errors():
    cfg = {
        "train": {
            "precision": "bf16",
            "grad_accumulation": 4,
            "gradient_checkpointing": True,
            "parallel_strategy": "fsdp",
        }
    }
    run = run_spec(cfg, "r")
    assert (run.precision, run.grad_accumulation, run.gradient_checkpointing, run.parallel_strategy) == (
        "bf16",
        4,
        True,
        "fsdp",
    )
    with pytest.raises(ConfigError, match=r"train\.precison: unknown setting"):
        run_spec({"train": {"precison": "bf16"}}, "r")
    # Coerced before: "false" (quoted) turned the GPU on, null turned determinism off, 1.7 was
    # seed 1, and a null worker count was a TypeError traceback.
    for key, value, says in [
        ("use_gpu", "false", "expected true or false; got 'false'"),
        ("deterministic", None, "expected true or false; got None"),
        ("seed", 1.7, "expected an integer; got 1.7"),
        ("num_workers", None, "expected an integer; got None"),
    ]:
        with pytest.raises(ConfigError, match=rf"train\.{key}: {re.escape(says)}"):
            run_spec({"train": {key: value}}, "r")


def test_two_trainings_started_in_one_second_get_runs_of_their_own():
    from workflows.train import new_run

    # A seed sweep launching jobs together: one run folder would mix (and resume) their checkpoints.
    names = {new_run({}, "data-dense").name for _ in range(5)}
    assert len(names) == 5 and all(n.startswith("data-dense-") for n in names)
    # A retrain names its own run even under the champion's train.run_name (see retrain/job.py).
    scoped = run_spec({"train": {"run_name": "dense-a"}}, "m-retrain-s", scope="retrain-s")
    assert scoped.name == "dense-a-retrain-s"


def test_a_benchmark_s_own_ray_never_joins_the_cluster_ray_address_names(monkeypatch):
    # The serve benchmarks end with serve.shutdown(): joined to the cluster RAY_ADDRESS named, they
    # removed every Serve app there. With local: true they start their own Ray and drop the address.
    import os

    import ray

    from workflows import ray_env

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray_env, "quiet_data_progress", lambda show: None)
    monkeypatch.setenv("RAY_ADDRESS", "ray://10.0.0.1:10001")
    ray_env.init_ray({"num_cpus": 2})
    assert calls[-1]["address"] == "ray://10.0.0.1:10001"  # an entry point still joins it
    ray_env.init_ray({"num_cpus": 2, "local": True})
    assert "address" not in calls[-1] and calls[-1]["_node_ip_address"] == "127.0.0.1"
    assert "RAY_ADDRESS" not in os.environ
