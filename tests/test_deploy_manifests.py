"""The deploy/ manifests of the registry and the schedules agree with each other and the code."""

from __future__ import annotations

import inspect
import shlex
from pathlib import Path

import yaml

from workflows.cli import app

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def docs(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / name).read_text()))


def retrain_args(command: str) -> list[str]:
    words = shlex.split(command)
    return words[words.index("retrain") + 1 :]


def test_mlflow_service_selects_its_deployment_and_reads_its_configmap():
    config, deployment, service = docs("mlflow.yaml")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == labels == deployment["spec"]["selector"]["matchLabels"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}
    keys = {v["configMapKeyRef"]["key"] for v in env.values() if "configMapKeyRef" in v}
    assert keys == set(config["data"]) and config["data"]["artifacts_destination"].startswith("s3://")
    # Clients reach the server by its Service name: MLflow must answer that Host header (its
    # default list holds only localhost and private IPs, and answers others 403).
    from mlflow.server.security_utils import is_allowed_host_header

    words = shlex.split(container["args"][0])
    allowed = words[words.index("--allowed-hosts") + 1].split(",")
    port = service["spec"]["ports"][0]["port"]
    assert is_allowed_host_header(allowed, f"{service['metadata']['name']}:{port}")


def test_both_schedules_run_the_same_retrain_and_never_overlap():
    (cron,) = docs("retrain_cronjob.yaml")
    (ray_cron,) = docs("rayjob_retrain.yaml")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert cron["spec"]["schedule"] == ray_cron["spec"]["schedule"]
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    cron_args = retrain_args(pod["args"][0])
    ray_args = retrain_args(ray_cron["spec"]["jobTemplate"]["entrypoint"])
    same = lambda args: [a for a in args if not a.startswith("retrain.out=")]  # noqa: E731
    assert same(cron_args) == same(ray_args)
    config = cron_args[cron_args.index("-c") + 1]
    assert (DEPLOY.parent / config).exists()
    # Every flag the schedules pass is one `toolscout retrain` takes.
    retrain = next(c for c in app.registered_commands if c.name == "retrain")
    params = inspect.signature(retrain.callback).parameters
    flags = {a[2:] for a in cron_args if a.startswith("--")}
    assert flags <= {p.replace("_", "-") for p in params}, flags


def test_the_tune_job_s_overrides_reach_the_trials():
    from workflows.cli_config import build_config
    from workflows.tune.settings import tune_settings
    from workflows.tune.sweep import base_config, max_concurrent

    (job,) = docs("rayjob_tune.yaml")
    words = shlex.split(job["spec"]["entrypoint"])
    config = words[words.index("-c") + 1]
    cfg = build_config(DEPLOY.parent / config, words[words.index("-c") + 2 :])
    settings = tune_settings(cfg, "tune")
    trial = base_config(cfg, settings)
    # The trials start from the bench entry (tune.entry): the shared volume reaches them.
    assert trial["method"]["params"]["semantic_cache"] == "/mnt/shared/semantic-cache"
    assert trial["train"]["resources_per_worker"] == {"CPU": 4} and trial["train"]["use_gpu"] is True
    # Four at once, as the comment says, whatever the cluster holds when the driver starts.
    assert max_concurrent({"CPU": 4.0, "GPU": 1.0}, settings) == 4
