"""``toolscout serve``: calibration from the CLI, clear errors, the server path, and the deploy files."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import ray
import requests
import yaml
from conftest import LOCAL_MODE
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import mcp_refusal_and_access
from typer.testing import CliRunner

from components.registry import resolve
from components.serving.app import ServeArgs, build_app, deployment_options, user_configs
from components.serving.calibration import find_calibration
from components.serving.deploy import check_config, ingress_urls, serve_config
from components.serving.deploy_checks import absolute_args
from workflows.cli import app
from workflows.serve import (
    DEFAULT_SERVE_CONFIG,
    app_args,
    deployable,
    lm_selector,
    read_serve_config,
    run_server,
    serve_options,
)

runner = CliRunner()
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_calibrate_only_writes_the_detector_file(bm25_versions, serving_data, tmp_path):
    file = tmp_path / "serving" / "detector.json"
    result = runner.invoke(
        app,
        [
            "serve",
            "--model",
            "models:/bm25@champion",  # v2 (lucene) in the fixture's registry
            "--data",
            serving_data,
            "--detector",
            str(file),
            "--calibrate-only",
            f"registry.root={bm25_versions['registry']['root']}",
        ],
    )
    assert result.exit_code == 0, result.output
    champion = resolve("models:/bm25@champion", bm25_versions["registry"])
    assert "calibrated" in result.output and find_calibration(str(file), champion, "onnx") is not None
    assert find_calibration(str(file), bm25_versions["default"], "onnx") is None  # only the version it serves


def test_uncalibrated_without_data_is_a_clear_error(bm25_versions, serving_data, tmp_path):
    config = tmp_path / "serve.yaml"
    # selector_training is read by --train-selector alone; left in the file, the app would refuse it.
    args = {"catalog": serving_data, "selector_training": {"steps": 10}}
    config.write_text(yaml.safe_dump({"applications": [{"args": args}]}))
    flags = [
        f"registry.root={bm25_versions['registry']['root']}",
        "--model",
        "models:/bm25@champion",
        "--detector",
        str(tmp_path / "d.json"),
        "--serve-config",
        str(config),
    ]
    result = runner.invoke(app, ["serve", *flags, "--calibrate-only"])
    assert result.exit_code == 1 and "pass --data" in result.output
    assert "selector_training is read with --train-selector only" in result.output


def test_serve_config_and_rayservice_agree():
    from ray.serve.schema import ServeDeploySchema

    config = read_serve_config(None)
    assert Path(DEFAULT_SERVE_CONFIG) == DEPLOY / "serve_config.yaml"
    ServeDeploySchema.model_validate(config)
    application = config["applications"][0]
    assert application["import_path"] == "components.serving.app:build_app"
    ServeArgs.model_validate(application["args"])
    assert {d["name"] for d in application["deployments"]} == {"Ingress", "Detector", "Retriever"}
    for d in application["deployments"]:
        assert d["ray_actor_options"]["num_cpus"] < 1 and d["autoscaling_config"]["min_replicas"] >= 1
    service = yaml.safe_load((DEPLOY / "rayservice.yaml").read_text())
    assert service["kind"] == "RayService"
    inner = yaml.safe_load(service["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(inner)
    assert inner["applications"] == config["applications"]


def test_the_shipped_config_serves_the_default_encoder_runtime():
    """The runtime chosen by benchmarks/encoder_runtime.py is the one ``toolscout serve`` and
    ``serve run deploy/serve_config.yaml`` start with (the file's value overrides the code's)."""
    from components.serving.models import DEFAULT_ENCODER_RUNTIME

    args = read_serve_config(None)["applications"][0]["args"]
    assert args["encoder_runtime"] == DEFAULT_ENCODER_RUNTIME
    assert (
        ServeArgs.model_validate({"artifact": "a", "catalog": "c"}).encoder_runtime == DEFAULT_ENCODER_RUNTIME
    )


@pytest.mark.parametrize(
    "batching, says",
    [
        ({"Retriever": {"max_batch_size": 0}}, "batching.Retriever.max_batch_size"),
        ({"Retriever": {"max_batch_size": 2.5}}, "fractional part"),
        ({"Retriever": {"batch_wait_timeout_s": -0.01}}, "batching.Retriever.batch_wait_timeout_s"),
        ({"Retreiver": {"max_batch_size": 8}}, "Input should be 'Detector', 'Retriever'"),
        ({"Retriever": {"max_batch": 8}}, "batching.Retriever.max_batch"),
    ],
)
def test_bad_batching_is_refused_on_the_driver_naming_the_entry(batching, says):
    # A size of 0 or 2.5 failed only in the replicas, as a failed swap; a misspelt deployment or
    # key was ignored without a word.
    config = serve_config({"artifact": "a", "catalog": "c", "batching": batching})
    with pytest.raises(ValueError, match="bad args") as e:
        check_config(config)
    assert says in str(e.value)
    shipped = read_serve_config(None)["applications"][0]["args"]["batching"]
    assert (
        ServeArgs.model_validate({"artifact": "a", "catalog": "c", "batching": shipped}).batching == shipped
    )


def test_no_stage_rejects_what_the_ingress_admits():
    """A stage at its ``max_ongoing_requests`` rejects, and Serve's router backs off while that
    replica idles (a Selector capped at 32 fell from 99 to 12 req/s at 64 clients)."""
    application = read_serve_config(None)["applications"][0]
    stages = [*application["deployments"], *application["args"]["deployments"]]
    cap = {d["name"]: d["max_ongoing_requests"] for d in stages}
    assert set(cap) == {"Ingress", "Detector", "Retriever", "QueryRewriter", "Selector"}
    assert all(c >= cap["Ingress"] for c in cap.values()), cap
    # A config that names no cap gets the same, not Serve's default of 5.
    bare = ServeArgs.model_validate({"artifact": "a", "catalog": "c"})
    assert deployment_options(bare, "Selector")["max_ongoing_requests"] == cap["Ingress"]


def test_a_stopping_replica_polls_for_drained_requests_quickly_unless_the_config_says_otherwise():
    # Serve's 2 s default made every rolling update and app delete wait ~2 s past the last request.
    bare = ServeArgs.model_validate({"artifact": "a", "catalog": "c"})
    assert deployment_options(bare, "Retriever")["graceful_shutdown_wait_loop_s"] == 0.1
    slow = {"name": "Retriever", "graceful_shutdown_wait_loop_s": 2.0}
    given = ServeArgs.model_validate({"artifact": "a", "catalog": "c", "deployments": [slow]})
    assert deployment_options(given, "Retriever")["graceful_shutdown_wait_loop_s"] == 2.0
    assert deployment_options(given, "Detector")["graceful_shutdown_wait_loop_s"] == 0.1


def test_flags_and_overrides_reach_the_args():
    config = read_serve_config(None)
    args = app_args(config, {"artifact": "a", "catalog": None}, ["serve.selector.backend=lm", "data.path=x"])
    assert args["artifact"] == "a" and args["catalog"] == config["applications"][0]["args"]["catalog"]
    assert args["selector"]["backend"] == "lm"
    names = [d["name"] for d in args["deployments"]]
    assert {"Ingress", "Detector", "Retriever", "Selector", "QueryRewriter"} == set(names)


def test_the_args_decide_what_is_served_and_the_files_server_options_are_kept(
    tmp_path, monkeypatch, bm25_versions, serving_data
):
    # The shipped file with a hot-swap user_config under Retriever, as its header says to write one.
    config = read_serve_config(None)
    retriever = next(d for d in config["applications"][0]["deployments"] if d["name"] == "Retriever")
    retriever["user_config"] = {"artifact": "/models/bm25/v1"}
    args = app_args(config, {"artifact": "/models/dense/v2", "catalog": "/data"}, [])
    deployed = deployable(args, config)["applications"][0]
    # Serve applies a file's user_config over the app's own: --model v2 would have served v1.
    assert not any("user_config" in d for d in deployed["deployments"])
    assert deployed["args"]["artifact"] == "/models/dense/v2"
    assert "user_config" in retriever  # the caller's config is left as it was
    # serve.start gets what `serve run` would take from the file, with the command's host and port.
    options = serve_options({**config, "http_options": {"host": "0.0.0.0", "request_timeout_s": 30}}, "h", 1)
    assert options == {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "h", "port": 1, "request_timeout_s": 30},
    }
    # --selector-lm keeps the section's deadline, and an lm section's own settings.
    assert lm_selector({"backend": "openai", "url": "u", "deadline_s": 5}, "m") == {
        "backend": "lm",
        "model": "m",
        "deadline_s": 5,
    }
    assert lm_selector({"backend": "lm", "model": "old", "max_value_tokens": 4}, "m")["max_value_tokens"] == 4
    # Relative local files of the rewriter and selector reach the replicas as absolute paths.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qg").mkdir()
    (tmp_path / "sel.gguf").write_text("")
    local = {"rewriter": {"backend": "querygen", "path": "qg"}, "selector": {"model": "sel.gguf"}}
    made = absolute_args(local)
    assert made["rewriter"]["path"] == str(tmp_path / "qg")
    assert made["selector"]["model"] == str(tmp_path / "sel.gguf")
    # So do they when the app is built by `serve run` / `serve deploy` (no toolscout serve before it).
    built = user_configs(ServeArgs(artifact=bm25_versions["default"], catalog=serving_data, **local))
    assert built["QueryRewriter"]["path"] == str(tmp_path / "qg")
    assert built["Selector"]["model"] == str(tmp_path / "sel.gguf")


def test_run_server_deploys_from_the_config_with_relative_paths(
    serve_instance, bm25_versions, serving_data, monkeypatch, tmp_path
):
    from ray import serve

    # `toolscout serve` starts Serve on its port with the config file's options; here that is the
    # port the session's Serve already runs on (a restart of Serve costs every later module ~8 s on
    # 2 cores), so the start is a no-op and the options are checked as built.
    port = int(serve_instance.rsplit(":", 1)[1])
    options = serve_options(read_serve_config(None), "127.0.0.1", port)
    assert options["http_options"]["host"] == "127.0.0.1" and options["http_options"]["port"] == port
    monkeypatch.chdir(Path(bm25_versions["root"]).parents[1])  # paths relative to here
    args = app_args(read_serve_config(None), {}, [])
    # With an API key, deployed from the shipped config file as `toolscout serve` does: its Ingress
    # entry has its own ray_actor_options, which Serve applies in place of the ones build_app sets,
    # and the key must still reach the replica.
    args |= {
        "artifact": "models/bm25/v0002",
        "catalog": serving_data,
        "calibration_data": serving_data,
        "detector_file": str(Path(bm25_versions["detector_file"]).relative_to(Path.cwd())),
        "api_key": "k-123",
        "allowed_origins": ["https://console.example.com"],
    }
    key = {"Authorization": "Bearer k-123"}
    try:
        url = run_server(args, "127.0.0.1", port, read_serve_config(None), blocking=False)
        info = requests.get(f"{url}/v1/tools", headers=key, timeout=10).json()
        assert info["model_version"] == "bm25/v0002"
        body = {"query": "weather forecast in Paris"}
        r = requests.post(f"{url}/v1/select", json=body, headers=key, timeout=30)
        assert r.status_code == 200 and r.json()["model_version"] == "bm25/v0002"
        refused_without_the_key(url)
        # A web page of another site (DNS rebinding) is refused on both doors, a listed one passes.
        for path in ("/v1/select", "/mcp/"):
            page = {**key, "Origin": "http://attacker.example"}
            assert requests.post(f"{url}{path}", json=body, headers=page, timeout=30).status_code == 403
        listed = {**key, "Origin": "https://console.example.com"}
        assert requests.post(f"{url}/v1/select", json=body, headers=listed, timeout=30).status_code == 200
        # Direct ingress: the ingress replica's own port answers the same, and binds loopback only.
        (direct,) = ingress_urls("127.0.0.1")
        assert ingress_urls("127.0.0.1", "no-such-app") == []
        assert direct != url
        d = requests.post(f"{direct}/v1/select", json=body, headers=key, timeout=30)
        assert d.status_code == 200 and d.json()["tools"] == r.json()["tools"]
        invalid = requests.post(f"{direct}/v1/select", json={"query": " "}, headers=key, timeout=30)
        assert invalid.status_code == 422
        assert requests.post(f"{direct}/v1/select", json=body, timeout=30).status_code == 401
        node_ip = ray.util.get_node_ip_address()
        if node_ip != "127.0.0.1":
            with pytest.raises(requests.ConnectionError):
                requests.get(f"http://{node_ip}:{direct.rsplit(':', 1)[1]}/healthz", timeout=5)
        # The builder also works with serve.run (a restart on every update, see
        # components.serving.deploy); mounted under a route prefix, the key guards the same paths.
        serve.run(build_app(absolute_args(args)), name="toolscout", route_prefix="/api")
        info = requests.get(f"{url}/api/v1/tools", headers=key, timeout=10).json()
        assert info["model_version"] == "bm25/v0002"
        refused_without_the_key(f"{url}/api")
    finally:
        for name in serve.status().applications:
            serve.delete(name)


def refused_without_the_key(api: str) -> None:
    """Every path but the public ones answers 401 without ``Bearer k-123``, MCP's included."""
    body = {"query": "weather in Paris"}
    assert requests.post(f"{api}/v1/select", json=body, timeout=30).status_code == 401
    wrong = requests.post(f"{api}/v1/select", json=body, headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    assert wrong.headers["WWW-Authenticate"] == "Bearer"
    assert (
        requests.post(f"{api}/v1/select", json={"query": 5}, timeout=30).status_code == 401
    )  # no schema hints
    for path in ("/v1/tools", "/v1/nope", "/admin"):
        assert requests.get(f"{api}{path}", timeout=10).status_code == 401, path
    for path in ("/healthz", "/docs", "/openapi.json"):
        assert requests.get(f"{api}{path}", timeout=10).status_code == 200, path
    mcp_refusal_and_access(f"{api}/mcp/")


def test_train_selector_on_the_configs_train_section_then_serve_it(ray_session, serving_data, tmp_path):
    from workflows.serve import train_selector
    from workflows.train import run_spec

    small = {"vocab_size": 300, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    args = {"catalog": serving_data, "selector_training": {"lm": small, "steps": 3, "max_examples": 50}}
    out = str(tmp_path / "lm")
    # As `toolscout serve --train-selector` builds it: the config's train section (here Ray Train's
    # local mode, see conftest.py; the default is one worker) decides where the run goes.
    train = {"storage_path": str(tmp_path / "runs"), "local_dir": str(tmp_path / "ckpt"), **LOCAL_MODE}
    updated = train_selector(args, serving_data, out, None, run_spec({"train": train}, "selector-1"))
    assert updated["selector"] == {"backend": "lm", "model": out} and "selector_training" not in updated
    assert (tmp_path / "lm" / "selector.json").exists() and (tmp_path / "lm" / "config.json").exists()
    assert (tmp_path / "ckpt" / "selector-1-init").is_dir() and any((tmp_path / "runs").iterdir())
    ServeArgs.model_validate({**updated, "artifact": "any"})


def test_ingress_api_key_is_what_the_middleware_requires(monkeypatch):
    from components.serving.errors import API_KEY_ENV, ApiKeyMiddleware
    from components.serving.ingress import Ingress

    before = os.environ.get(API_KEY_ENV)
    # setenv first: it records the variable's prior state, so monkeypatch restores it after Ingress
    # writes os.environ; delenv on an unset variable would record nothing.
    monkeypatch.setenv(API_KEY_ENV, "placeholder")
    monkeypatch.delenv(API_KEY_ENV)
    Ingress(None, None)
    assert ApiKeyMiddleware(None).expected is None  # no key configured: open, as before
    Ingress(None, None, api_key="k-1")  # Serve builds the app (and its middleware) after this
    assert ApiKeyMiddleware(None).expected == b"k-1"
    monkeypatch.undo()
    assert os.environ.get(API_KEY_ENV) == before  # the key does not leak into later tests


def test_the_drivers_splits_reach_the_replicas_args(bm25_versions, serving_data):
    # A replica calibrating a version followed later reads valid as the driver did: with default
    # splits it would carve another valid, or refuse a prepared directory written with these.
    from workflows.serve import prepare

    args = {"artifact": bm25_versions["default"], "detector_file": bm25_versions["detector_file"]}
    splits = {"mode": "cold_start", "seed": 3}
    assert prepare(args, None, splits)["splits"] == splits
    built = ServeArgs(**prepare(args, None, splits), catalog=serving_data)
    assert user_configs(built)["Detector"]["splits"] == splits  # what the Detector replicas get


def test_a_swap_is_checked_against_the_version_it_serves_not_the_one_the_app_was_built_with(
    bm25_versions, serving_data, tmp_path
):
    # The app was built from a run directory cleaned up since; later swaps keep its args as built
    # (or Serve would restart it), so the check must read the Retriever's pinned version instead.
    import shutil

    from components.serving.deploy import IMPORT_PATH, check_config

    gone = tmp_path / "gone"
    shutil.copytree(bm25_versions["default"], gone)
    args = {"artifact": str(gone), "catalog": serving_data, "detector_file": bm25_versions["detector_file"]}
    built = user_configs(ServeArgs(**args))
    shutil.rmtree(gone)
    swapped = {**built["Retriever"], "artifact": bm25_versions["lucene"]}
    app = {"name": "toolscout", "import_path": IMPORT_PATH, "args": args}
    check_config({"applications": [{**app, "deployments": [{"name": "Retriever", "user_config": swapped}]}]})
    with pytest.raises(ValueError, match="gone"):
        check_config({"applications": [app]})  # no swap: the args' own artifact is what is built


def test_a_swap_leaves_a_pinned_detector_as_it_serves(bm25_versions, serving_data):
    # Rebuilt on a swap, a detector_artifact given as a registry alias was resolved again and the
    # Detector moved, unchecked and never rolled back, to what the alias named then.
    from components.serving.deploy import IMPORT_PATH
    from components.serving.swap import swap_artifact

    args = {
        "artifact": bm25_versions["default"],
        "detector_artifact": bm25_versions["default"],
        "catalog": serving_data,
        "detector_file": bm25_versions["detector_file"],
    }
    serving = {**user_configs(ServeArgs(**args))["Detector"], "served_since": "v1"}
    app = {"name": "toolscout", "import_path": IMPORT_PATH, "args": args}
    app["deployments"] = [{"name": "Detector", "user_config": serving}]
    swapped = swap_artifact({"applications": [app]}, bm25_versions["lucene"])
    deployments = {d["name"]: d["user_config"] for d in swapped["applications"][0]["deployments"]}
    assert deployments["Detector"] == serving
    assert deployments["Retriever"]["artifact"].endswith(bm25_versions["lucene"].rsplit("/", 1)[-1])


def documented_user_configs(text: str) -> dict[str, set[str]]:
    """The key sets written as ``Retriever: {a, b}`` / ``Detector `{a, b}``` in a comment or doc."""
    flat = " ".join(line.lstrip("#").strip() for line in text.splitlines())
    found = {}
    for name in ("Retriever", "Detector"):
        match = re.search(name + r":?\s*`?\{([^}]*)\}", flat)
        assert match, name
        found[name] = {k.strip() for k in match.group(1).split(",")}
    return found


def test_the_documented_hot_swap_user_configs_are_the_ones_the_app_builds(bm25_versions, serving_data):
    # Serve replaces a user_config whole: a hand-written one missing a key the replicas read drops it.
    args = ServeArgs.model_validate(
        {
            "artifact": bm25_versions["default"],
            "catalog": serving_data,
            "detector_file": bm25_versions["detector_file"],
            "batching": {
                n: {"max_batch_size": 8, "batch_wait_timeout_s": 0.01} for n in ("Retriever", "Detector")
            },
        }
    )
    built = user_configs(args)
    registry_version = {"source", "registry"}  # added for a models:/ artifact
    for path in (
        DEPLOY / "serve_config.yaml",
        DEPLOY / "rayservice.yaml",
        DEPLOY.parent / "docs" / "serving.md",
    ):
        for name, keys in documented_user_configs(path.read_text()).items():
            assert keys == set(built[name]) | registry_version, (path.name, name)
