"""Loopback load on the Serve graph vs the same models in-process, and faults under load.

Full run (10 s per load, on a quiet machine)::

    python -m benchmarks.serve_load --data ../shared/datasets/toollens --seconds 10

Short check (what a shared machine allows; the .md says it is a short run)::

    python -m benchmarks.serve_load --seconds 2

Without ``--model`` it trains, once, under ``--work``: BM25 (two versions: default and lucene
analyzers), a dense bi-encoder (Ray Train) and the selector LM on ToolLens train queries, read in
place. Loads: detection → retrieval (no LLM) per model and the full graph (constrained selector
LM), at 1, 8 and 32 concurrent keep-alive clients (asyncio + aiohttp) for ``--seconds`` each, after
a 1 s warm-up. One client measures the unloaded latency of the hops; with c clients in a closed loop
the median can be no lower than about c / throughput (Little's law), so 8 clients at p50 15 ms
would take some 530 req/s. Every request forces retrieval (``needs_tool_threshold: 0``) so each
one runs the whole chain. The in-process baseline calls the same loaded models sequentially in
this process, in the same run. Faults: one Retriever replica killed (``ray.kill`` on the actor
found by name), and a hot-swap of the artifact through the deployments' user configs, each while 8
clients run.

``--methods`` / ``--artifact NAME=DIR`` add every other method's graph (ToolGen, ToolWeaver, dense
and MassTool on MiniLM, query generation as the rewriter), each with its in-process baseline batched
as Serve batches it and paced loads at the serving targets (see :func:`method_scenario`)::

    python -m benchmarks.serve_load --skip-base --methods bm25 dense_minilm toolgen toolweaver querygen \
        --artifact masstool_minilm=runs/bench-models/masstool_minilm_cpu \
        --out benchmarks/results/serve_load_methods.json

Every load runs twice, through the two doors a client can use: Serve's HTTP proxy (the one stable
address) and direct ingress (the ingress replicas' own ports, one hop shorter; clients are spread
over the replicas listed by :func:`components.serving.deploy.ingress_urls`). Rows say which.

Closed loops measure saturation: each client sends its next request as soon as the last returns,
so the server always runs flat out and p50 is set by the client count. Latency at a given traffic
level is measured by paced (open-loop) loads on detect → retrieve: the same 8 clients send on a
fixed schedule at ``--rates`` requests per second in all, and each latency counts from the
request's scheduled send time, so a request that waits behind a slow one is charged for the wait
(no coordinated omission; a late timer wake-up is charged too). Each rate runs ``--repeats`` times
and the median run is reported; the proxy, which saturates lower, is paced at the lowest rate only.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import sys
import threading
import time
from typing import Any

import aiohttp
import numpy as np
import ray
import torch
from fastapi import FastAPI
from ray import serve

from components import methods
from components.data import Dataset, open_dataset
from components.registry import resolve
from components.serving.app import ServeArgs
from components.serving.catalog import load_catalog
from components.serving.deploy import (
    APP_NAME,
    apply_serve_env,
    deploy_config,
    ingress_urls,
    serve_config,
)
from components.serving.models import (
    DEFAULT_ENCODER_RUNTIME,
    DetectorModel,
    RetrieverModel,
    ensure_calibration,
    same_ranking,
    top_score,
)
from components.serving.replicas import replica_actor, replica_names, wait_for_replicas
from components.serving.rewriter import Rewriter, build_rewriter, rewriter_settings
from components.serving.selector_lm import LMSelector
from components.serving.selector_train import train_selector_lm
from components.serving.swap import swap_artifact
from components.training.spec import RunSpec
from workflows.cli_config import packaged_config
from workflows.ray_env import init_ray
from workflows.report import md_table, write_report
from workflows.serve import app_args, read_serve_config
from workflows.train import fit_method

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serve_load.json")
DENSE = {
    "epochs": 1,
    "batch_size": 64,
    "lr": 1e-3,
    "tool_max_length": 64,
    "encoder": {
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 4,
        "intermediate_size": 512,
        "max_length": 48,
    },
}
SELECTOR_LM = {
    "vocab_size": 4000,
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "intermediate_size": 256,
}
GOAL = {"p50_ms": 15.0, "p99_ms": 50.0, "rps": 120.0}
# How long a load client waits for an answer before it gives the request up (serve_autoscale too).
CLIENT_TIMEOUT_S = 30.0
NOOP_API = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=128)
class NoopStage:
    """A stage that does nothing: what a Serve hop costs without a model."""

    async def run(self, payload: Any) -> dict:
        return {"probability": 1.0, "version": "noop", "tools": []}


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=128)
@serve.ingress(NOOP_API)
class NoopIngress:
    """The toolscout graph's shape (HTTP -> ingress -> 2 chained handle calls) with no model work."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    @NOOP_API.post("/v1/select")
    async def select(self, body: dict) -> dict:
        await self.first.run.remote(body["query"])
        await self.second.run.remote(body["query"])
        return {"model_version": "noop"}


def doors(proxy: str, app_name: str = APP_NAME) -> dict[str, list[str]]:
    """The base URLs to load, per path: the proxy, and the ingress replicas' own ports (direct
    ingress; absent when it is off). Asked again after every deploy, since replicas' ports change."""
    paths = {"proxy": [proxy]}
    direct = ingress_urls("127.0.0.1", app_name)
    if direct:
        paths["direct ingress"] = direct
    return paths


def row(method: str, config: dict, metrics: dict, split: str = "test") -> dict:
    """One result row of the report (this benchmark's loads read the test queries)."""
    return {"method": method, "config": config, "split": split, "metrics": metrics}


def serve_floor(proxy: str, bodies: list[dict], clients: list[int], seconds: float) -> list[dict]:
    """Load on the no-op graph: what Serve's proxy and handle hops cost on this machine without
    models and without ``@serve.batch`` (so the batched toolscout graph can outrun it under load)."""
    app = NoopIngress.bind(NoopStage.options(name="A").bind(), NoopStage.options(name="B").bind())
    serve.run(app, name="noop", route_prefix="/")
    rows = [
        row(
            "serve: no-op graph (same hops, no models)",
            {"model": "-", "path": path, "clients": n, "seconds": seconds},
            load(urls, bodies, n, seconds),
        )
        for path, urls in doors(proxy, "noop").items()
        for n in clients
    ]
    serve.delete("noop")
    return rows


def build_artifact(
    data: Dataset, work: str, model: str, key: str, method_name: str, params: dict, **run: Any
) -> str:
    """``work/models/<model>`` (``<name>/<version>``, what the served version reads):
    ``method_name`` with ``params`` trained on ``data`` on Ray Train (``run`` adds :class:`RunSpec`
    fields, ``key`` names the run) and saved, or reused if present."""
    path = os.path.join(work, "models", model)
    if not os.path.exists(os.path.join(path, "config.json")):
        method = methods.build(method_name, params)
        spec = RunSpec(
            name=f"serve-load-{key}",
            storage_path=os.path.join(work, "train"),
            local_dir=os.path.join(work, "checkpoints"),
            **run,
        )
        fit_method(method, data, spec)
        method.save(path)
    return path


def train_artifacts(
    data: Dataset,
    work: str,
    dense_epochs: int,
    keys: tuple[str, ...] = ("bm25", "bm25_v2", "dense"),
    dense: dict | None = None,
) -> dict[str, str]:
    """BM25 v0001 (default), v0002 (lucene) and dense v0001 (``dense`` params, default
    :data:`DENSE`) under ``work/models`` (those of ``keys``), reused if present."""
    plan = {
        "bm25": ("bm25/v0001", "bm25", {"profile": "default"}),
        "bm25_v2": ("bm25/v0002", "bm25", {"profile": "lucene"}),
        "dense": ("dense/v0001", "dense", {**(dense or DENSE), "epochs": dense_epochs}),
    }
    return {key: build_artifact(data, work, plan[key][0], key, *plan[key][1:]) for key in keys}


# Every registered method in the load test. ToolGen and ToolWeaver keep their bench entry's model
# and decoding with each training stage cut to one epoch: what a request costs is the LM's size and
# the trie-constrained beam search, not how long it trained (their accuracy is reported in
# toollens_toolgen.md / toollens_toolweaver.md, not here). Dense on MiniLM and query generation on
# llama.cpp are zero-shot (modes of those methods that need no training); MassTool on MiniLM trains
# for an hour on 2 cores, so it comes trained (--artifact masstool_minilm=DIR).
LM_ENTRIES = {"toolgen": "toollens_toolgen", "toolweaver": "toollens_toolweaver"}
DENSE_MINILM = {"encoder": "minilm", "id_head": False, "tool_max_length": 96}
ZERO_SHOT = {
    "dense_minilm": ("dense", {**DENSE_MINILM, "epochs": 0}),
    "querygen": ("querygen", {"generator": {"engine": "llamacpp", "model": "smollm2-135m"}}),
}
METHOD_TARGETS = {"direct ingress": 120.0, "proxy": 60.0}  # paced rates of issue 29's targets
METHODS_NOTE = (
    "\nPer-method rows (`--methods`, `--artifact`): each method's graph as `toolscout serve` deploys it "
    "(detector: the method's own, MassTool's, else a score threshold calibrated on valid; query "
    "generation is the rewriter in front of BM25, its fallback timeout raised to 60 s so that every "
    "answer waited for its rewrite), with the answer caches off (each load replays the same test "
    "queries). Their in-process row: p50 / p99 one query at a time, "
    "req/s on batches of 8 (as `@serve.batch` hands them to a replica), and their rps ratio = Serve "
    "req/s / that batched req/s (goal for 8 clients: ≥ 0.7). Paced at 120 req/s through direct ingress "
    "and 60 through the proxy (goals: p50 ≤ 15 ms, p99 ≤ 50 ms direct; p99 ≤ 60 ms proxy), or at 0.8× "
    "the 8-client closed-loop capacity measured just before where that is lower (the cell says so). "
    "ToolGen / ToolWeaver: the bench entries' LM and decoding (10 beams, trie-constrained), each training "
    "stage cut to one epoch (cost per request does not depend on training length; accuracy is in "
    "their own reports); dense MiniLM and query generation (SmolLM2-135M GGUF on llama.cpp) zero-shot.\n"
)


def one_epoch(params: dict) -> dict:
    """``params`` with every training stage's epochs cut to at most one."""
    stages = {name: {**s, "epochs": min(int(s.get("epochs", 1)), 1)} for name, s in params["stages"].items()}
    return {**params, "stages": stages}


def method_artifacts(data: Dataset, work: str, names: list[str]) -> dict[str, str]:
    """The ``names`` artifacts (keys of :data:`LM_ENTRIES` / :data:`ZERO_SHOT`) under
    ``work/models/<name>/v0001``, trained on Ray Train (1 worker, both cores) and reused if present."""
    out = {}
    for name in names:
        if name in LM_ENTRIES:
            entry = packaged_config(LM_ENTRIES[name])["bench"]["methods"][name]
            method_name, params = entry.get("method", name), one_epoch(entry["params"])
        else:
            method_name, params = ZERO_SHOT[name]
        out[name] = build_artifact(
            data,
            work,
            f"{name}/v0001",
            name,
            method_name,
            params,
            resources_per_worker={"CPU": 2},
            env={"OMP_WAIT_POLICY": "PASSIVE"},
        )
    return out


def selector_model(data: Dataset, catalog_path: str, work: str, steps: int) -> str:
    path = os.path.join(work, "selector_lm")
    if not os.path.exists(os.path.join(path, "selector.json")):
        report = train_selector_lm(data, load_catalog(catalog_path), path, lm=SELECTOR_LM, steps=steps)
        loss = f"{report['first_loss']:.2f} -> {report['last_loss']:.2f}"
        print(f"selector LM: loss {loss} ({report['seconds']:.0f}s)")
    return path


def summary(
    latencies: list[float], errors: int, seconds: float, failed: list[float] | None = None
) -> dict[str, float]:
    """Percentiles over every measured request, the ``failed`` ones' times included (a request that
    timed out is the latency its client saw, and leaving it out would lower p99 exactly under
    faults); req/s counts the ``latencies`` of successful ones only."""
    every = [*latencies, *(failed or [])]
    ms = np.array(every) * 1000 if every else np.array([float("nan")])
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),  # read it with `samples`: under 100, one request
        "rps": len(latencies) / seconds,
        "errors": errors,
        "requests": len(latencies) + errors,
        "samples": len(every),
    }


def shares_ranking(detector: DetectorModel, retriever: RetrieverModel, rewriter: Rewriter | None) -> bool:
    """Whether the ingress would let ``detector`` decide from ``retriever``'s answer (app arg
    ``share_ranking``, components/serving/ingress.py): a detector of the same artifact, no rewriter
    in between."""
    return rewriter is None and same_ranking(detector.reads_ranking_of, retriever.ranking)


def ranks_once(graph_args: dict) -> bool:
    """Whether the graph deployed from these app args shares one ranking between detection and
    retrieval (``share_ranking``, from the Serve config or the flags, else the app's default): the
    in-process baseline must do the same work, or the ratios compare one ranking against two."""
    return bool(graph_args.get("share_ranking", ServeArgs.model_fields["share_ranking"].default))


def in_process(
    detector: DetectorModel,
    retriever: RetrieverModel,
    selector: Any,
    queries: list[str],
    seconds: float,
    rewriter: Rewriter | None = None,
    shared: bool = False,
):
    """The same chain called directly, one query after another, for ``seconds``; ``shared``: as the
    ingress with ``share_ranking`` (one ranking answers detection and retrieval, see
    :func:`shares_ranking`)."""
    shared = shared and shares_ranking(detector, retriever, rewriter)
    latencies = []
    began = time.perf_counter()
    end = began + seconds
    i = 0
    while time.perf_counter() < end:
        q = queries[i % len(queries)]
        i += 1
        start = time.perf_counter()
        if shared:
            ((ranking, detected),) = retriever.retrieve_detected([q], 5)
            detector.probability_from(top_score(ranking), detected)
        else:
            detector.probabilities([q])
            text = rewriter.rewrite_many([(q, [])])[0] if rewriter is not None else q
            ranking = retriever.retrieve([text], 5)[0]
        if selector is not None and ranking:
            selector.select(q, [], [t for t, _ in ranking])
        latencies.append(time.perf_counter() - start)
    # The last call may end well past ``end`` (a selector LM takes seconds a query): req/s over the
    # time the calls took, not over the nominal ``seconds``.
    return summary(latencies, 0, time.perf_counter() - began)


def in_process_batched(
    detector: DetectorModel,
    retriever: RetrieverModel,
    queries: list[str],
    seconds: float,
    rewriter: Rewriter | None = None,
    batch: int = 8,
    shared: bool = False,
) -> float:
    """Requests per second of detect (→ rewrite) → retrieve called on batches of ``batch`` queries,
    as ``@serve.batch`` hands them to the replicas (8 at most, see components/serving/deployments.py):
    what the same models can do in this process when a batch is full."""
    shared = shared and shares_ranking(detector, retriever, rewriter)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        texts = [queries[(done + j) % len(queries)] for j in range(batch)]
        if shared:
            for ranking, detected in retriever.retrieve_detected(texts, 5):
                detector.probability_from(top_score(ranking), detected)
            done += batch
            continue
        detector.probabilities(texts)
        if rewriter is not None:
            texts = rewriter.rewrite_many([(t, []) for t in texts])
        retriever.retrieve(texts, 5)
        done += batch
    return done / (time.perf_counter() - start)


async def _load(
    urls: list[str],
    bodies: list[dict],
    clients: int,
    seconds: float,
    warmup: float,
    on_start=None,
    rate: float | None = None,
) -> dict:
    """``clients`` keep-alive clients posting, client ``c`` to ``urls[c % len(urls)]``; latencies of
    requests sent after the warm-up only.

    Without ``rate`` each client loops (closed loop). With ``rate`` the clients share a fixed
    schedule of ``rate`` requests per second (client ``c`` owns slots ``c, c + clients, ...``) and a
    latency counts from the slot's time, so a client that falls behind is charged for it."""
    latencies: list[float] = []
    errors: list[str] = []
    failed: list[float] = []  # how long each failed request took
    versions: list[str] = []
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    ) as session:
        t0 = time.perf_counter()
        measure_from, stop_at = t0 + warmup, t0 + warmup + seconds
        completed = 0  # successes that completed inside the window, whenever they were sent

        async def client(c: int) -> None:
            nonlocal completed
            i, url = c, urls[c % len(urls)]
            while True:
                if rate is None:
                    now = time.perf_counter()
                else:  # open loop: the slot's time, not the moment this client got free
                    now = t0 + i / rate
                    if (delay := now - time.perf_counter()) > 0:
                        await asyncio.sleep(delay)
                if now >= stop_at:
                    break
                body = bodies[i % len(bodies)]
                i += clients
                try:
                    async with session.post(f"{url}/v1/select", json=body) as r:
                        ok = r.status == 200
                        payload = await r.json(content_type=None)
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:  # ValueError: not JSON
                    ok, payload = False, {"error": repr(e)}
                done = time.perf_counter()
                completed += ok and measure_from <= done < stop_at
                if now >= measure_from:
                    if ok:
                        latencies.append(done - now)
                        versions.append(payload["model_version"])
                    else:
                        errors.append(str(payload)[:200])
                        failed.append(done - now)

        tasks = [asyncio.create_task(client(c)) for c in range(clients)]
        if on_start is not None:
            await asyncio.sleep(warmup)
            await asyncio.to_thread(on_start)
        await asyncio.gather(*tasks)
    for sample in errors[:3]:  # what went wrong, next to the count the report carries
        print(f"load error ({len(errors)} in all): {sample}", file=sys.stderr)
    # req/s: successes completed inside the window over its length. Counting those sent in it over
    # the time until the last finished put the warm-up's backlog (up to a request per client) into
    # the time and not into the count: 8 clients at ~1 s a request read 0.58 req/s, not ~0.9.
    # A paced client that fell behind completes fewer inside the window: never more than offered.
    out = summary(latencies, len(errors), seconds, failed)
    return {**out, "rps": completed / seconds, "versions": sorted(set(versions))}


def load(
    urls: list[str],
    bodies: list[dict],
    clients: int,
    seconds: float,
    on_start=None,
    rate: float | None = None,
) -> dict:
    """A closed-loop load, or a paced one at ``rate`` requests per second (see :func:`_load`)."""
    return asyncio.run(_load(urls, bodies, clients, seconds, 1.0, on_start, rate))


def with_ratios(m: dict, baseline: dict, rps: bool = True) -> dict:
    """``m`` with its p50 (and, unless ``rps`` is false, its req/s) as ratios of the in-process
    baseline of the same run."""
    out = {**m, "ratio": m["p50_ms"] / baseline["p50_ms"]}
    return out | ({"rps_ratio": m["rps"] / baseline["rps"]} if rps else {})


def paced_loads(
    paths: dict[str, list[str]],
    rates: dict[str, list[float]],
    bodies: list[dict],
    version: str,
    seconds: float,
    baseline: dict,
    repeats: int,
    label: str = "detect→retrieve",
    capped: dict[str, float] | None = None,
) -> list[dict]:
    """Latency at fixed traffic levels: 8 clients on a shared schedule of ``rate`` req/s per path
    (``rates[path]``), ``repeats`` runs per rate, reported as the median run (p50, p99 and req/s
    each) with every run's p99 beside it. Complements the closed loops, which only show the saturated
    server. ``capped[path]`` marks a rate cut to below that path's capacity (see
    :func:`method_rates`)."""
    rows = []
    for path, urls in paths.items():
        for rate in rates.get(path, []):
            runs = [load(urls, bodies, 8, seconds, rate=rate) for _ in range(repeats)]
            m: dict[str, Any] = {
                key: float(np.median([r[key] for r in runs])) for key in ("p50_ms", "p99_ms", "rps")
            }
            m["errors"] = sum(r["errors"] for r in runs)
            m["requests"] = sum(r["requests"] for r in runs)
            m["p99_ms_runs"] = [round(r["p99_ms"], 1) for r in runs]
            # No req/s ratio: a paced load's throughput is the rate it was offered, not a capacity
            # to hold against the in-process one (it read 0.01-0.03, meaning nothing).
            m = with_ratios(m, baseline, rps=False)
            config = {
                "model": version,
                "path": path,
                "clients": 8,
                "rate": rate,
                "seconds": seconds,
                "repeats": repeats,
            }
            if capped and path in capped:
                config["capped_from"] = capped[path]
            rows.append(row(f"serve: {label}, paced", config, m))
            print(
                f"paced {label} {rate:g}/s via {path} x8, median of {repeats}: p50 {m['p50_ms']:.1f} ms "
                f"p99 {m['p99_ms']:.1f} ms (runs {m['p99_ms_runs']}) {m['rps']:.0f} req/s "
                f"errors {m['errors']}"
            )
    return rows


def bm25_rates(paths: dict[str, list[str]], rates: list[float]) -> dict[str, list[float]]:
    """BM25's paced rates: every one of ``rates`` through direct ingress; the proxy, which saturates
    near 130 req/s on 2 cores, at the lowest only: above its capacity the schedule's backlog only grows."""
    return {path: sorted(rates)[:1] if path == "proxy" else list(rates) for path in paths}


def method_rates(
    targets: dict[str, float], capacity: dict[str, float]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per path, the target rate (issue 29: 120 req/s direct, 60 through the proxy), or 0.8× the
    8-client closed-loop capacity measured just before where the target is above it: a schedule
    past capacity only measures its own backlog (and a slow LM method would take minutes to drain
    it). Returns (rates, {path: target} for the capped ones)."""
    rates, capped = {}, {}
    for path, target in targets.items():
        if path not in capacity:
            continue
        if capacity[path] * 0.8 < target:
            rates[path], capped[path] = [round(capacity[path] * 0.8, 1)], target
        else:
            rates[path] = [target]
    return rates, capped


def method_scenario(
    proxy: str,
    base: dict,
    label: str,
    flags: dict,
    queries: list[str],
    bodies: list[dict],
    args: argparse.Namespace,
) -> list[dict]:
    """One method's graph (``flags`` as ``toolscout serve`` takes them) under load: the same models
    in this process one query at a time (p50, p99) and on batches of 8 (req/s: the ratio Serve's
    8-client throughput is judged by), closed loops of ``--method-clients`` through both doors, and
    paced loads at :data:`METHOD_TARGETS` (capped below capacity, see :func:`method_rates`)."""
    graph_args = app_args(base, flags, [])
    deploy_config(serve_config(graph_args, base))
    runtime = DEFAULT_ENCODER_RUNTIME  # in process on the encoder runtime the replicas run
    detector = DetectorModel(flags["artifact"], flags["detector_file"], encoder_runtime=runtime)
    retriever = RetrieverModel(flags["artifact"], runtime)
    rewriter = build_rewriter(rewriter_settings(flags["rewriter"])) if flags.get("rewriter") else None
    shared = ranks_once(graph_args)
    single = in_process(detector, retriever, None, queries, args.seconds, rewriter, shared=shared)
    batched = in_process_batched(detector, retriever, queries, args.seconds, rewriter, shared=shared)
    baseline = {"p50_ms": single["p50_ms"], "rps": batched}
    version = retriever.version
    rows = [
        row(
            f"in-process: {label}",
            {"model": version, "path": "-", "clients": 1, "batch": "1 (p50) / 8 (rps)"},
            {**single, "rps": batched, "rps_one_at_a_time": single["rps"], "ratio": 1.0, "rps_ratio": 1.0},
        )
    ]
    print(f"{label} {version} in process: p50 {single['p50_ms']:.1f} ms, batched {batched:.0f} req/s")
    paths, capacity = doors(proxy), {}
    for path, urls in paths.items():
        for clients in args.method_clients:
            m = with_ratios(load(urls, bodies, clients, args.seconds), baseline)
            rows.append(
                row(
                    f"serve: {label}",
                    {"model": version, "path": path, "clients": clients, "seconds": args.seconds},
                    m,
                )
            )
            if clients == 8:
                capacity[path] = m["rps"]
            print(
                f"{label} {version} via {path} x{clients}: p50 {m['p50_ms']:.1f} ms "
                f"p99 {m['p99_ms']:.1f} ms {m['rps']:.0f} req/s errors {m['errors']}"
            )
    rates, capped = method_rates(METHOD_TARGETS, capacity)
    rows += paced_loads(paths, rates, bodies, version, args.seconds, baseline, args.repeats, label, capped)
    serve.delete(APP_NAME)
    return rows


def method_flags(name: str, artifacts: dict[str, str], catalog: str, detector_file: str) -> tuple[str, dict]:
    """(scenario label, serve flags) for one ``--methods`` / ``--artifact`` entry: query generation
    is the rewriter in front of BM25, every other method the retriever (its own detector, MassTool's,
    or a score threshold calibrated on valid)."""
    # Answer caches off: every load replays the test queries from the first, so from the second load
    # on a cache would answer without the models (benchmarks/serve_batching.py measures the cache).
    flags = {
        "catalog": catalog,
        "detector_file": detector_file,
        "selector": {"backend": "none"},
        "cache_size": 0,
    }
    if name == "querygen":
        # Past timeout_s the graph answers with the query itself (components/serving/deployments.py);
        # a long one here, so every request's latency includes its rewrite.
        rewriter = {"backend": "querygen", "path": artifacts[name], "cache_size": 0, "timeout_s": 60.0}
        return "detect→rewrite (querygen, llama.cpp)→retrieve", {
            **flags,
            "artifact": artifacts["bm25"],
            "rewriter": rewriter,
        }
    return f"detect→retrieve ({name})", {**flags, "artifact": artifacts[name]}


def fault_drills(
    proxy: str, config: dict, bodies: list[dict], artifacts: dict[str, str], seconds: float
) -> list[dict]:
    """Per path: kill a Retriever replica, then hot-swap the artifact, each under 8 clients; count
    failures. The swap alternates v0001 -> v0002 -> v0001 so each one changes the version (skipped
    when the two are one artifact)."""
    rows = []
    with_two = copy.deepcopy(config)
    app = with_two["applications"][0]
    app["deployments"] = [d for d in app.get("deployments", []) if d["name"] != "Retriever"]
    # Two replicas, pinned: the app's code options carry an autoscaling config (from the config
    # file's args), which a fixed num_replicas here would conflict with.
    pinned = {"min_replicas": 2, "max_replicas": 2, "target_ongoing_requests": 16}
    app["deployments"].append(
        {"name": "Retriever", "autoscaling_config": pinned, "ray_actor_options": {"num_cpus": 0.25}}
    )
    deploy_config(with_two)
    targets = [artifacts["bm25_v2"], artifacts["bm25"]]
    # Given one artifact (--model with --dense), v2 is v1 and a swap would change nothing.
    swaps = targets[0] != targets[1]
    if not swaps:
        print("fault drills: hot-swap skipped, one BM25 artifact given (a swap to itself changes nothing)")
    for path, urls in doors(proxy).items():
        wait_for_replicas("Retriever", 2)
        victim = replica_names("Retriever")[0]

        def kill(victim: str = victim) -> None:
            time.sleep(seconds / 3)
            ray.kill(replica_actor(victim), no_restart=True)

        killed = load(
            urls, bodies, 8, seconds, on_start=lambda: threading.Thread(target=kill, daemon=True).start()
        )
        rows.append(
            ("kill one Retriever replica", path, killed, {"replicas": 2, "killed": victim.split("#")[-1]})
        )
        wait_for_replicas("Retriever", 2)
        if not swaps:
            continue
        target = targets.pop(0)

        def swap(target: str = target) -> None:
            time.sleep(seconds / 3)
            deploy_config(swap_artifact(with_two, target))

        swapped = load(
            urls, bodies, 8, seconds, on_start=lambda: threading.Thread(target=swap, daemon=True).start()
        )
        version = "/".join(os.path.normpath(target).split(os.sep)[-2:])
        rows.append((f"hot-swap to {version}", path, swapped, {"replicas": 2}))
    return [
        row(f"fault: {name}", {"path": path, "clients": 8, "seconds": seconds, **extra}, m)
        for name, path, m, extra in rows
    ]


def base_scenarios(
    proxy: str,
    base: dict,
    artifacts: dict[str, str],
    catalog: str,
    detector_file: str,
    selector_path: str,
    queries: list[str],
    bodies: list[dict],
    args: argparse.Namespace,
) -> list[dict]:
    """BM25 and the tiny dense model detect → retrieve, and the full graph with the LM selector, at
    ``--clients`` through both doors; BM25 paced at ``--rates`` and through the fault drills."""
    rows: list[dict] = []
    scenarios = [
        ("detect→retrieve", "bm25", None),
        ("detect→retrieve", "dense", None),
        ("full graph (LM selector)", "bm25", {"backend": "lm", "model": selector_path}),
    ]
    for label, key, selector in scenarios:
        # The config file's args (deployment options, batching) under these flags, as `toolscout
        # serve` builds them: the graph measured here is the one users get.
        flags = {
            "artifact": artifacts[key],
            "catalog": catalog,
            "detector_file": detector_file,
            "selector": selector or {"backend": "none"},
            "cache_size": 0,  # every load replays the test queries: a cache would answer them
        }
        graph_args = app_args(base, flags, [])
        app_config = serve_config(graph_args, base)
        deploy_config(app_config)
        # In process on the encoder runtime the replicas run (the app's default).
        detector = DetectorModel(artifacts[key], detector_file, encoder_runtime=DEFAULT_ENCODER_RUNTIME)
        retriever = RetrieverModel(artifacts[key], DEFAULT_ENCODER_RUNTIME)
        lm = LMSelector(selector_path, load_catalog(catalog)) if selector else None
        # Ranked once or twice as the deployed graph ranks (the Serve config's share_ranking).
        shared = ranks_once(graph_args)
        base_metrics = in_process(detector, retriever, lm, queries, args.seconds, shared=shared)
        version = retriever.version
        rows.append(
            row(
                f"in-process: {label}",
                {"model": version, "path": "-", "clients": 1},
                {**base_metrics, "ratio": 1.0, "rps_ratio": 1.0},
            )
        )
        for path, urls in doors(proxy).items():
            for clients in args.clients:
                m = with_ratios(load(urls, bodies, clients, args.seconds), base_metrics)
                config = {"model": version, "path": path, "clients": clients, "seconds": args.seconds}
                rows.append(row(f"serve: {label}", config, m))
                print(
                    f"{label} {version} via {path} x{clients}: p50 {m['p50_ms']:.1f} ms "
                    f"p99 {m['p99_ms']:.1f} ms {m['rps']:.0f} req/s errors {m['errors']}"
                )
        if key == "bm25" and selector is None:
            paths = doors(proxy)
            rows += paced_loads(
                paths,
                bm25_rates(paths, args.rates),
                bodies,
                version,
                args.seconds,
                base_metrics,
                args.repeats,
            )
            rows += fault_drills(proxy, app_config, bodies, artifacts, max(args.seconds, 4.0))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--model", help="Artifact to serve (default: BM25 trained here)")
    parser.add_argument("--dense", help="Dense artifact for the dense rows (default: trained here)")
    parser.add_argument("--work", default="runs/serve_load")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--rates", type=float, nargs="*", default=[120.0, 150.0, 300.0], help="paced loads, req/s (8 clients)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per paced rate (median reported)")
    parser.add_argument("--dense-epochs", type=int, default=1)
    parser.add_argument("--selector-steps", type=int, default=300)
    parser.add_argument(
        "--methods",
        nargs="*",
        default=[],
        choices=["bm25", *LM_ENTRIES, *ZERO_SHOT],
        help="also load these methods' artifacts, built here under --work (see LM_ENTRIES, ZERO_SHOT)",
    )
    parser.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also load this trained artifact (a dir or models:/ URI), e.g. "
        "masstool_minilm=runs/bench-models/masstool_minilm_cpu; repeatable",
    )
    parser.add_argument(
        "--method-clients", type=int, nargs="+", default=[1, 8], help="closed loops per method"
    )
    parser.add_argument(
        "--skip-base",
        action="store_true",
        help="only the no-op floor and the --methods / --artifact scenarios (no BM25 / tiny dense / LM "
        "selector rows, no fault drills)",
    )
    parser.add_argument(
        "--ranked-twice",
        action="store_true",
        help="run each --methods / --artifact scenario first with share_ranking off (Detector and "
        "Retriever each rank the query), then as deployed by default (one shared ranking)",
    )
    parser.add_argument(
        "--serve-config",
        help="Serve config whose deployment options the graphs run with (default: deploy/serve_config.yaml)",
    )
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    short = args.seconds < 10
    load_before = os.getloadavg()[0]
    torch.set_num_threads(1)  # in-process baseline and training: one thread, as each replica gets
    settings = apply_serve_env()  # what `toolscout serve` runs with; export =0 to compare
    init_ray({"num_cpus": 2, "progress_bars": False, "local": True})
    data = open_dataset(args.data)
    work = os.path.abspath(args.work)
    keys = ("bm25",) if args.skip_base else ("bm25", "bm25_v2", "dense")
    given = args.model and (args.dense or args.skip_base)
    artifacts = train_artifacts(data, work, args.dense_epochs, keys) if not given else {}
    artifacts["bm25"] = os.path.abspath(resolve(args.model)) if args.model else artifacts["bm25"]
    detector_file = os.path.join(work, "detector.json")
    if not args.skip_base:
        artifacts["dense"] = os.path.abspath(resolve(args.dense)) if args.dense else artifacts["dense"]
        artifacts.setdefault("bm25_v2", artifacts["bm25"])
        for key in ("bm25", "bm25_v2", "dense"):
            ensure_calibration(artifacts[key], args.data, detector_file)
    named = dict(entry.split("=", 1) for entry in args.artifact)
    artifacts.update(method_artifacts(data, work, [m for m in args.methods if m != "bm25"]))
    artifacts.update({name: os.path.abspath(resolve(path)) for name, path in named.items()})
    catalog = os.path.abspath(args.data)
    scenarios = [method_flags(name, artifacts, catalog, detector_file) for name in [*args.methods, *named]]
    for _, flags in scenarios:
        ensure_calibration(flags["artifact"], args.data, detector_file)
    queries = list(data.split_queries("test").values())
    bodies = [{"query": q, "top_k": 5, "needs_tool_threshold": 0.0} for q in queries]

    port = 18000 + os.getpid() % 1000
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    proxy = f"http://127.0.0.1:{port}"
    base = read_serve_config(args.serve_config)
    rows = serve_floor(proxy, bodies, args.clients, args.seconds)
    if not args.skip_base:
        selector_path = selector_model(data, catalog, work, args.selector_steps)
        rows += base_scenarios(
            proxy, base, artifacts, catalog, detector_file, selector_path, queries, bodies, args
        )
    for label, flags in scenarios:
        if args.ranked_twice:
            twice = {**flags, "share_ranking": False}
            rows += method_scenario(proxy, base, f"{label}, ranked twice", twice, queries, bodies, args)
        rows += method_scenario(proxy, base, label, flags, queries, bodies, args)
    serve.shutdown()
    machine = f"1-min load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end. "
    note = (
        f"**SHORT RUN ({args.seconds:g} s per load) on a shared 2-core machine: a functional check, not the "
        "reported figures; rerun with --seconds 10 on a quiet machine.** "
        if short
        else ""
    )
    report = {
        "dataset": "toollens",
        "serve_env": settings,
        "notes": note
        + machine
        + f"Serve env {settings}. "
        + f"2 CPU cores, Ray {ray.__version__}, client and server on the same cores; "
        "p50/p99 per request, rps = completed / seconds; ratio = serve p50 / in-process p50 of the same "
        "models (in-process = sequential calls in this process, same run); path: through Serve's HTTP proxy, "
        "or direct ingress (the ingress replica's own port, no proxy hop); the no-op graph is the same "
        "HTTP → ingress → 2 handle calls with no model work and no @serve.batch, i.e. the unbatched hop "
        "cost in this run; a closed loop of c clients has p50 ≳ c / req/s (Little's law); paced rows: 8 "
        "clients on a fixed schedule of `offered` req/s in all, latency from each request's scheduled "
        "send time, the median of repeated runs (every run's p99 in the JSON); goal for "
        "detect→retrieve: "
        f"p50 ≤ {GOAL['p50_ms']:g} ms, p99 ≤ {GOAL['p99_ms']:g} ms, ≥ {GOAL['rps']:g} req/s, 0 errors.\n"
        + (METHODS_NOTE if scenarios else ""),
        "results": rows,
    }
    write_markdown(report, args.out)


def p99_cell(m: dict) -> str:
    """p99, with the range over runs where a row is the median of several."""
    runs = m.get("p99_ms_runs") or []
    if len(runs) < 2:
        return f"{m['p99_ms']:.1f}"
    return f"{m['p99_ms']:.1f} ({min(runs):.1f}–{max(runs):.1f})"


def offered(config: dict) -> str:
    """The offered-load cell: closed loop, or the paced rate (and the target it was cut down from)."""
    if "batch" in config:  # a per-method in-process row: req/s on batches of 8
        return "one at a time; req/s on batches of 8"
    if "rate" not in config:
        return "closed loop"
    if "capped_from" in config:
        return f"{config['rate']:g} (0.8× capacity; target {config['capped_from']:g})"
    return f"{config['rate']:g}"


def write_markdown(report: dict, out: str) -> None:
    """JSON + a load table and a fault table."""
    loads, faults = [], []
    for r in report["results"]:
        m, c = r["metrics"], r["config"]
        if r["method"].startswith("fault"):
            faults.append(
                [
                    r["method"][7:],
                    c["path"],
                    str(m["requests"]),
                    str(m["errors"]),
                    f"{m['p50_ms']:.1f}",
                    f"{m['p99_ms']:.1f}",
                    ", ".join(m["versions"]),
                ]
            )
            continue
        rps_ratio = f"{m['rps_ratio']:.2f}" if "rps_ratio" in m else "-"
        ratios = [f"{m['ratio']:.2f}", rps_ratio] if "ratio" in m else ["-", "-"]
        loads.append(
            [
                r["method"],
                c["model"],
                c["path"],
                str(c["clients"]),
                offered(c),
                f"{m['p50_ms']:.1f}",
                p99_cell(m),
                f"{m['rps']:.0f}" if m["rps"] >= 10 else f"{m['rps']:.1f}",
                str(m["errors"]),
                *ratios,
            ]
        )
    load_head = [
        "scenario",
        "model",
        "path",
        "clients",
        "offered req/s",
        "p50 ms",
        "p99 ms",
        "req/s",
        "errors",
        "p50 ratio",
        "rps ratio",
    ]
    fault_head = ["fault", "path", "requests", "failed", "p50 ms", "p99 ms", "versions answering"]
    fault_section = ["", "## Faults under load", "", *md_table(fault_head, faults)] if faults else []
    text = "\n".join([*md_table(load_head, loads), *fault_section])
    write_report(
        report, out, title="Serve load: Ray Serve graph vs in-process", plot=False, table=text + "\n"
    )
    print(text)


if __name__ == "__main__":
    main()
