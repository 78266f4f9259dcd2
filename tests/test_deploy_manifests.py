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
    # Both name the registry server in the job's own runtime env: a cluster whose pods lack
    # MLFLOW_TRACKING_URI ran the round on an empty embedded store and crowned it ungated.
    import json

    words = shlex.split(pod["args"][0])
    cron_env = json.loads(words[words.index("--runtime-env-json") + 1])
    ray_env = yaml.safe_load(ray_cron["spec"]["jobTemplate"]["runtimeEnvYAML"])
    uri = cron_env["env_vars"]["MLFLOW_TRACKING_URI"]
    assert uri.startswith("http") and ray_env["env_vars"]["MLFLOW_TRACKING_URI"] == uri


def test_the_tune_job_s_overrides_reach_the_trials():
    from workflows.cli_config import build_config
    from workflows.tune.resources import max_concurrent
    from workflows.tune.settings import tune_settings
    from workflows.tune.sweep import base_config

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


def cluster_specs() -> dict[str, dict]:
    """Every RayCluster spec in deploy/: RayJobs', the RayService's."""
    specs = {}
    for name in ("rayjob_bench.yaml", "rayjob_tune.yaml", "rayservice.yaml"):
        (doc,) = docs(name)
        specs[name] = doc["spec"].get("rayClusterSpec") or doc["spec"]["rayClusterConfig"]
    return specs


def test_a_worker_group_that_scales_has_the_autoscaler_to_scale_it():
    # KubeRay starts `replicas` pods; min/maxReplicas are the autoscaler's. Without it a group at
    # replicas 0 (the GPU groups) never gets a pod, and GPU work waits forever.
    for name, spec in cluster_specs().items():
        for group in spec["workerGroupSpecs"]:
            if group.get("maxReplicas", group["replicas"]) > group["replicas"]:
                assert spec.get("enableInTreeAutoscaling") is True, (name, group["groupName"])


def test_pods_that_run_drivers_and_workers_carry_the_service_account_and_the_project_dir():
    # Jobs' drivers and Ray Train workers read and write s3:// on these pods, and `-c workflows/...`
    # is relative to the project: not the submitting pod's business.
    for name, spec in cluster_specs().items():
        pods = [spec["headGroupSpec"]["template"]["spec"]]
        pods += [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
        for pod in pods:
            assert pod.get("serviceAccountName") == "toolscout", name
            assert pod["containers"][0].get("workingDir") == "/app", name


def test_the_retrain_schedules_use_no_volume_their_cluster_does_not_mount():
    from workflows.cli_config import build_config

    (service,) = docs("rayservice.yaml")
    spec = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    mounted = {m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
    (cron,) = docs("retrain_cronjob.yaml")
    (ray_cron,) = docs("rayjob_retrain.yaml")
    commands = [cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][0]]
    commands.append(ray_cron["spec"]["jobTemplate"]["entrypoint"])
    for command in commands:
        words = shlex.split(command)
        # Every /mnt path the job reads: in its arguments (key=value or a flag's value) and in the
        # config file it passes, after `extends:`.
        paths = mount_paths(words, build_config(DEPLOY.parent / words[words.index("-c") + 1], []))
        assert all(any(p.startswith(m) for m in mounted) for p in paths), paths


def mount_paths(words: list[str], config: dict) -> list[str]:
    """The /mnt paths a job reads: in its arguments (key=value or a flag's value) and its config."""
    paths = [w[w.index("/mnt/") :] for w in words if "/mnt/" in w]
    return paths + [v for v in flat_values(config) if isinstance(v, str) and v.startswith("/mnt/")]


def flat_values(tree: object) -> list[object]:
    """Every leaf value of a nested config."""
    if isinstance(tree, dict):
        return [v for x in tree.values() for v in flat_values(x)]
    if isinstance(tree, list):
        return [v for x in tree for v in flat_values(x)]
    return [tree]


def test_the_volume_check_sees_a_mount_path_in_an_argument():
    # The check above finds nothing to object to today: show it would see a /mnt path if one came back.
    words = shlex.split("toolscout retrain --data /mnt/shared/data method.params.semantic_cache=/mnt/x")
    config = {"method": {"params": {"semantic_cache": "/mnt/y", "epochs": 3}}, "data": {"path": "s3://b"}}
    assert mount_paths(words, config) == ["/mnt/shared/data", "/mnt/x", "/mnt/y"]


def test_the_ray_cluster_config_installs_what_each_node_needs():
    # The AWS autoscaler on the head imports boto3, which nothing in the project pulled in; CPU
    # nodes took PyPI's CUDA torch (GBs each); workers had no S3 access for their checkpoints.
    import json
    import os

    import jsonschema
    import ray

    config = yaml.safe_load((DEPLOY.parent / "ray_cluster.yaml").read_text())
    schema = json.loads(Path(os.path.dirname(ray.__file__), "autoscaler", "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    head = config["setup_commands"] + config["head_setup_commands"]
    assert any("boto3" in c and "-e ~/toolscout" in c for c in head)
    for name, node in config["available_node_types"].items():
        if name == config["head_node_type"]:
            commands = head
        else:
            assert node["node_config"]["IamInstanceProfile"], name
            commands = node["worker_setup_commands"]  # a node type's own list replaces the global one
        install = next(i for i, c in enumerate(commands) if "-e ~/toolscout" in c)
        cpu_torch = [i for i, c in enumerate(commands) if "download.pytorch.org/whl/cpu" in c]
        gpu = node["resources"].get("GPU", 0) > 0
        assert (not cpu_torch) if gpu else (cpu_torch and cpu_torch[0] < install), name
