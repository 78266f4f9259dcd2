"""A trained query rewriter served as a LoRA adapter by Ray Serve LLM (vLLM's CPU build), against
the same weights merged and run in this process and against the base model on the same engine.

    python -m benchmarks.serve_lora --artifact <querygen artifact> --data ../shared/datasets/toollens \\
        --queries 20 --vllm-python /path/to/vllm-env/bin/python

The artifact's generator (SmolLM2-135M-Instruct after LoRA stages, merged) is exported as one
adapter over SmolLM2 (:func:`components.methods.querygen.adapter.export_generator_adapter`) to a
moto S3 server on 127.0.0.1 (Ray Serve LLM loads adapters from object stores only), and the LLM app
is deployed with that store as its ``lora_dir``. The first ``--queries`` ToolLens test queries (by
id) are rewritten one at a time, greedy, with the artifact's prompt and token cap, by:

- ``in-process``: the merged LM under transformers (the artifact's own rewriter);
- ``vLLM base``: ``smollm2`` on the LLM app (the untrained model: the engine's cost without LoRA);
- ``vLLM adapter``: ``smollm2:<name>`` on the same app (the trained rewriter, LoRA applied by vLLM).

``agreement``: the share of rewrites identical to the in-process ones (1.0 when the adapter is the
merged LM: then every ranking is the in-process one too); ``words``: the rewrites' mean length
(generation time grows with it); ``ratio``: a row's p50 over the vLLM base row's, same run.
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks.serve_llm import cell, deploy_llm_app, engine_parser, parse_engine_args, timed, write_table
from benchmarks.serve_load import summary
from components.data import open_dataset
from components.methods.querygen.adapter import export_generator_adapter
from components.serving.rewriter import QueryGenRewriter

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serve_lora.json")
HEAD = ["rewriter", "p50_ms", "p99_ms", "agreement", "words", "errors", "ratio"]


def moto_store() -> tuple[Any, dict[str, str]]:
    """A moto S3 server on 127.0.0.1 with bucket ``adapters``, and the environment its clients need."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(env)
    boto3.client("s3").create_bucket(Bucket="adapters")
    return server, env


def row(name: str, seconds: list[float], errors: int, **config: Any) -> dict:
    return {
        "method": name,
        "config": config,
        "split": "test",
        "metrics": summary(seconds, errors, sum(seconds) or 1.0),
    }


def main() -> None:
    parser = engine_parser(__doc__.splitlines()[0], RESULTS)
    parser.add_argument("--artifact", required=True, help="A query-generation artifact (SmolLM2 + LoRA).")
    parser.add_argument("--max-lora-rank", type=int, default=32)
    args = parse_engine_args(parser)
    dataset = open_dataset(args.data)
    test = dataset.split_queries("test")
    ids = sorted(test)[: args.queries]
    queries = [test[q] for q in ids]

    server, env = moto_store()
    start = time.perf_counter()
    export = export_generator_adapter(args.artifact, "s3://adapters/rewriter")
    export_seconds = time.perf_counter() - start
    print(export, flush=True)

    local = QueryGenRewriter(args.artifact)
    local.rewrite(queries[0], [])  # load the LM
    # Each engine's rewrites (compared below) and its result row, in the same order.
    reference, seconds, errors = timed(lambda q: local.rewrite(q, []), queries)
    rewrites, results = [reference], [row("in-process, transformers, merged LM", seconds, errors)]

    from ray import serve

    from workflows.ray_env import init_ray

    init_ray({"progress_bars": False, "local": True})  # its serve.shutdown() is for its own Ray
    llm_args = {
        "model": "smollm2-135m",
        "max_model_len": 2048,
        "lora_dir": "s3://adapters",
        "max_lora_rank": args.max_lora_rank,
        "env_vars": env,
    }
    url, deploy_seconds = deploy_llm_app(llm_args, args.vllm_python)
    try:
        for name, model in (
            ("Ray Serve LLM, vLLM CPU: base model", "smollm2"),
            ("Ray Serve LLM, vLLM CPU: adapter", "smollm2:rewriter"),
        ):
            served = QueryGenRewriter(
                args.artifact, endpoint={"endpoint": url, "model": model, "timeout_s": 180}
            )
            served.rewrite(queries[0], [])  # the engine's first request (and the adapter's load)
            texts, seconds, errors = timed(lambda q, s=served: s.rewrite(q, []), queries)
            rewrites.append(texts)
            results.append(row(name, seconds, errors, model=model))
    finally:
        serve.shutdown()
        server.stop()

    base_p50 = results[1]["metrics"]["p50_ms"]
    for r, texts in zip(results, rewrites, strict=True):
        same = [a is not None and a == b for a, b in zip(texts, reference, strict=True)]
        r["metrics"]["agreement"] = sum(same) / len(same)
        # Generation time grows with the answer: how long each engine's rewrites are.
        r["metrics"]["words"] = sum(len((t or "").split()) for t in texts) / len(texts)
        r["metrics"]["ratio"] = r["metrics"]["p50_ms"] / base_p50
        r["config"] |= {"queries": len(queries), "adapter_rank": export.rank}
    write_table(
        results,
        args.out,
        "A trained rewriter as a LoRA adapter on Ray Serve LLM (vLLM CPU) vs merged in process",
        HEAD,
        lambda r: [
            r["method"],
            *(
                cell(r["metrics"], k, d)
                for k, d in (("p50_ms", 1), ("p99_ms", 1), ("agreement", 3), ("words", 1))
            ),
            str(r["metrics"]["errors"]),
            cell(r["metrics"], "ratio", 2),
        ],
        f"Adapter: rank {export.rank} over {export.modules} projections, max relative residual "
        f"{export.max_residual:.1e}, exported in {export_seconds:.1f} s. Ray Serve LLM app deployed "
        f"(vLLM started) in {deploy_seconds:.0f} s.",
    )


if __name__ == "__main__":
    main()
