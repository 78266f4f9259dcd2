"""The selector's and the query rewriter's LM on the two CPU engines: Ray Serve LLM (vLLM's CPU
build, through Serve's HTTP proxy) against llama.cpp (in this process), SmolLM2-135M-Instruct.

    python -m benchmarks.serve_llm --data ../shared/datasets/toollens --queries 20 \\
        --vllm-python /path/to/vllm-env/bin/python

The same ToolLens test queries (the first ``--queries`` by id) go one at a time through:

- ``select``: pick one of the query's BM25 top-5 tools and fill its arguments. On vLLM the
  candidates are the request's functions with ``tool_choice: "required"``
  (:class:`~components.serving.selector_http.OpenAISelector`, decoding bound by a JSON-schema
  grammar); on llama.cpp a GBNF grammar of the candidates' calls
  (:class:`~components.serving.selector_llamacpp.LlamaCppSelector`). ``valid`` is the share of
  answers that are a call of an offered tool with its required arguments; ``hallucination_rate``
  the share naming a tool that was not offered.
- ``rewrite``: query generation's zero-shot rewrite (its system prompt, 24-token cap, stop at the
  first line break), greedy, through the engine's rewriter client (``LlamaCppLM.rewrite``,
  ``ChatEndpoint.rewrite``), the call the serving rewriter makes.

llama.cpp runs first with 2 threads, before the vLLM engine starts (an idle engine still holds its
memory); then the LLM app is deployed from the Serve config entry that
:func:`components.serving.llm_app.llm_application` writes, in the vLLM environment's interpreter.
``ratio``: the vLLM row's p50 over the llama.cpp row's for the same measure, same run.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from benchmarks.serve_load import summary
from components.data import open_dataset
from components.generative.chat_endpoint import ChatEndpoint
from components.generative.llamacpp import LlamaCppLM
from components.methods import build
from components.methods.querygen.params import QueryGenParams
from components.serving.catalog import load_catalog
from components.serving.llm_app import endpoint_url, llm_application
from components.serving.selector_http import OpenAISelector
from components.serving.selector_llamacpp import LlamaCppSelector
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serve_llm.json")
HEAD = ["engine", "measure", "p50_ms", "p99_ms", "valid", "hallucination_rate", "errors", "ratio"]


def timed(fn: Any, items: list[Any]) -> tuple[list[Any], list[float], int]:
    """``fn`` on each item in turn: the answers, the seconds of each, and how many raised."""
    answers, seconds, errors = [], [], 0
    for item in items:
        start = time.perf_counter()
        try:
            answers.append(fn(item))
            seconds.append(time.perf_counter() - start)
        except Exception as e:  # an engine error is a measured outcome here, not a crash
            print(f"error: {e}", flush=True)
            answers.append(None)
            errors += 1
    return answers, seconds, errors


def vllm_select(selector: OpenAISelector, query: str, candidates: list[str]) -> tuple[bool, bool]:
    """(valid call, names a tool that was not offered) for one query on the endpoint."""
    if not candidates:
        return False, False  # nothing retrieved: no call (the selector sends no request)
    answer = selector.post(selector.request_body(query, [], candidates))
    calls = answer["choices"][0]["message"].get("tool_calls") or []
    name = calls[0]["function"]["name"] if calls else ""
    offered = {f"tool_{i}" for i in range(len(candidates))}
    return selector.parse(answer, candidates) is not None, bool(calls) and name not in offered


def row(engine: str, measure: str, answers: list, seconds: list[float], errors: int, queries: int) -> dict:
    """One result row; select answers are (valid, out-of-offer) pairs, rewrites are strings."""
    metrics: dict[str, Any] = summary(seconds, errors, sum(seconds) or 1.0)
    if measure == "select":
        done = [a for a in answers if a is not None]
        metrics["valid"] = sum(v for v, _ in done) / len(answers)
        metrics["hallucination_rate"] = sum(h for _, h in done) / len(answers)
    config = {"queries": queries, "model": "SmolLM2-135M-Instruct"}
    return {"method": engine, "config": {**config, "measure": measure}, "split": "test", "metrics": metrics}


def engine_rows(engine: str, select: Any, rewriter: Any, picks: list[tuple[str, list[str]]]) -> list[dict]:
    """The select and rewrite rows of one engine: ``select(query, candidates)`` gives (valid,
    out-of-offer); ``rewriter`` is the engine's rewriter client (``rewrite(system, texts, cap)``,
    the call the serving rewriter makes)."""
    system, cap = QueryGenParams.system_prompt, QueryGenParams.max_new_tokens
    queries = [q for q, _ in picks]

    def rewrite(query: str) -> str:
        return rewriter.rewrite(system, [query], cap)[0]

    rewrite(queries[0])  # load / the engine's first request, and cache the system prefix
    return [
        row(engine, "select", *timed(lambda p: select(*p), picks), len(picks)),
        row(engine, "rewrite", *timed(rewrite, queries), len(picks)),
    ]


def llamacpp_select(selector: LlamaCppSelector, query: str, candidates: list[str]) -> tuple[bool, bool]:
    """(valid call, names a tool that was not offered); the grammar admits only offered tools' calls."""
    call = selector.select(query, [], candidates)
    return call is not None, call is not None and call["tool"] not in candidates


def cell(metrics: dict, key: str, digits: int) -> str:
    return f"{metrics[key]:.{digits}f}" if key in metrics else "-"


def deploy_llm_app(llm_args: dict[str, Any], python: str, port: int = 8000) -> tuple[str, float]:
    """A local Ray and Serve on 127.0.0.1:``port`` with the LLM app for ``llm_args`` deployed (its
    engine in ``python``'s environment, which has vLLM); returns the app's ``/v1`` URL and the
    seconds the deploy took (vLLM's start-up)."""
    from ray import serve

    from components.serving.deploy import apply_serve_env, deploy_config
    from workflows.ray_env import init_ray

    apply_serve_env()
    init_ray({"num_cpus": 2, "progress_bars": False, "local": True})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    start = time.perf_counter()
    deploy_config({"applications": [llm_application(llm_args, python=python)]})  # waits 900 s for an LLM app
    return endpoint_url("127.0.0.1", port), time.perf_counter() - start


def write_table(
    results: list[dict], out: str, title: str, head: list[str], cells: Callable[[dict], list[str]], note: str
) -> None:
    """The ToolLens results JSON and its markdown table (one row of ``cells`` per result), then ``note``."""
    table = [*md_table(head, [cells(r) for r in results]), "", note]
    write_report({"dataset": "toollens", "results": results}, out, title=title, plot=False, table=table)


def engine_parser(description: str, out: str) -> argparse.ArgumentParser:
    """The options of every benchmark of the LM engines: data, query count, vLLM's interpreter, out."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--vllm-python", default=os.environ.get("TOOLSCOUT_VLLM_PYTHON"))
    parser.add_argument("--out", default=out)
    return parser


def parse_engine_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The parsed options; no vLLM interpreter is an error that says how to name one."""
    args = parser.parse_args()
    if not args.vllm_python:
        parser.error("--vllm-python (or TOOLSCOUT_VLLM_PYTHON): the interpreter of an environment with vLLM")
    return args


def main() -> None:
    args = parse_engine_args(engine_parser(__doc__.splitlines()[0], RESULTS))
    dataset = open_dataset(args.data)
    catalog = load_catalog(args.data)
    test = dataset.split_queries("test")
    ids = sorted(test)[: args.queries]
    bm25 = build("bm25", {})
    bm25.index(dataset.corpus)
    hits = bm25.retrieve({q: test[q] for q in ids}, 5)
    picks = [(test[q], list(hits[q])) for q in ids]

    selector = LlamaCppSelector(catalog, model="smollm2-135m", n_threads=2)
    results = engine_rows(
        "llama.cpp Q4_1, 2 threads, in-process",
        partial(llamacpp_select, selector),
        LlamaCppLM(model="smollm2-135m", n_threads=2),
        picks,
    )
    print(results, flush=True)

    from ray import serve

    url, deploy_seconds = deploy_llm_app({"model": "smollm2-135m", "max_model_len": 2048}, args.vllm_python)
    try:
        results += engine_rows(
            "Ray Serve LLM, vLLM CPU fp32, via proxy",
            partial(vllm_select, OpenAISelector(url, "smollm2", catalog, timeout_s=180)),
            ChatEndpoint(endpoint=url, model="smollm2", timeout_s=180),
            picks,
        )
    finally:
        serve.shutdown()
    for r in results[2:]:
        base = next(b for b in results[:2] if b["config"]["measure"] == r["config"]["measure"])
        r["metrics"]["ratio"] = r["metrics"]["p50_ms"] / base["metrics"]["p50_ms"]
        r["config"]["deploy_seconds"] = round(deploy_seconds, 1)
    write_table(
        results,
        args.out,
        "The selector's and rewriter's LM on CPU: Ray Serve LLM (vLLM) vs llama.cpp, SmolLM2-135M",
        HEAD,
        lambda r: [
            r["method"],
            r["config"]["measure"],
            *(cell(r["metrics"], k, d) for k, d in (("p50_ms", 1), ("p99_ms", 1), ("valid", 3))),
            cell(r["metrics"], "hallucination_rate", 3),
            str(r["metrics"]["errors"]),
            cell(r["metrics"], "ratio", 2),
        ],
        f"Ray Serve LLM app deployed (vLLM started) in {deploy_seconds:.0f} s.",
    )


if __name__ == "__main__":
    main()
