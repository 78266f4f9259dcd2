"""ToolWeaver at ToolBench's scale: ~47,000 tools coded with L×K tokens, against ToolGen's one per tool.

ToolBench's catalog (ToolGen's setting, 46,985 tools) is not shipped here, so a catalog of that size
is assembled from the two real ones that are: ToolLens (464 RapidAPI tools) and LiveMCPBench (527 MCP
tools). RapidAPI itself lists the same capability from many providers, so each real tool appears
under 48 providers (``tool_name: Recipes by <Provider>``, a region and plan added to its
description): 991 × 48 = 47,568 tools, many of them near-duplicates, as in a real marketplace.
Co-usage comes from real co-usage: each of 200,000 sessions takes the tool set of a ToolLens
training query or a LiveMCPBench task and one provider for the whole session (70 %; else a
provider per tool), so co-used tools are those real queries use together.

Measured: the codes stage exactly as ``toolscout train`` runs it (tool texts embedded by MiniLM
with Ray Data, the RQ-VAE trained as a Ray Train stage, Sinkhorn assignment, collision pass) with
L = 2, K = 1,024; new tokens (L×K vs one per tool); collision rate before and after the pass;
code-assignment time; trie size; LM embedding growth in MB for the scratch LM and SmolLM2-135M; and
trie-constrained beam search latency per query on CPU (batch 1, 10 beams, top 10) for both codes
on the same (untrained: latency does not depend on the weights) scratch LM.

    python benchmarks/toolweaver_scale.py [--providers 48] [--sessions 200000] [--queries 200]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from components.data.livemcpbench import convert
from components.data.loader import load_dataset
from components.data.types import Dataset
from components.generative import sequences as td
from components.generative.constrained import constrained_top_k
from components.generative.lm import LMSpec, build_causal_lm
from components.generative.packaged import resolve_lm
from components.generative.targeted import TargetedLM
from components.generative.tool_tokens import ToolCodebook, add_code_tokens, add_tool_tokens
from components.methods.toolweaver.method import ToolWeaverMethod
from components.training.spec import RunSpec
from workflows.quiet import quiet_libraries
from workflows.ray_env import init_ray
from workflows.report import md_table, write_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "toolweaver_scale.json")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "datasets")
SYLLABLES = ["ra", "pi", "do", "ne", "ku", "lo", "vi", "ta", "se", "mo", "zu", "fa", "qi", "xo", "be", "ly"]
REGIONS = ["EU", "US", "APAC", "LATAM", "Africa", "global"]
PLANS = ["free", "basic", "pro", "enterprise"]


def providers(n: int, seed: int) -> list[str]:
    """``n`` distinct made-up provider names (``Kulovi API``...)."""
    rng, names = random.Random(seed), set()
    while len(names) < n:
        names.add(
            "".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize() + rng.choice([" API", "", " Labs"])
        )
    return sorted(names)


def variant_text(text: str, provider: str, region: str, plan: str) -> str:
    """The real tool's text as ``provider`` offers it (name and description marked)."""
    note = f" Offered by {provider} ({region} endpoint, {plan} plan)."
    if "tool_name:" in text:
        head, _, rest = text.partition("tool_name:")
        name, sep, tail = rest.partition(",")
        text = f"{head}tool_name:{name.strip()} by {provider}{sep}{tail}"
    else:
        text = f"{provider}: {text}"
    if "api_description:" in text:
        head, _, rest = text.partition("api_description:")
        return f"{head}api_description:{rest.split(', required_params')[0]}{note}" + (
            ", required_params" + rest.split(", required_params", 1)[1] if ", required_params" in rest else ""
        )
    return text + note


def assemble(n_providers: int, n_sessions: int, seed: int = 0) -> tuple[Dataset, dict[str, int]]:
    """The ~47k-tool catalog and its co-usage sessions (see module docstring)."""
    toollens = load_dataset(os.path.join(SHARED, "toollens"))
    with tempfile.TemporaryDirectory() as work:
        convert(os.path.join(SHARED, "livemcpbench"), work)
        mcp = load_dataset(work)
    bases = {f"tl:{t}": r["text"] for t, r in toollens.corpus.items()} | {
        f"mcp:{t}": r["text"] for t, r in mcp.corpus.items()
    }
    sets = [[f"tl:{t}" for t in rel] for rel in toollens.qrels["train"].values() if len(rel) > 1]
    sets += [[f"mcp:{t}" for t in rel] for rel in mcp.qrels["test"].values() if len(rel) > 1]
    names = providers(n_providers, seed)
    rng = random.Random(seed)
    corpus = {}
    for base, text in bases.items():
        for p, provider in enumerate(names):
            tid = f"{base}@{p}"
            corpus[tid] = {
                "_id": tid,
                "title": "",
                "text": variant_text(text, provider, rng.choice(REGIONS), rng.choice(PLANS)),
            }
    sessions = {}
    for s in range(n_sessions):
        tools = rng.choice(sets)
        shared = rng.randrange(n_providers)
        sessions[f"s{s}"] = {
            f"{t}@{shared if rng.random() < 0.7 else rng.randrange(n_providers)}": 1 for t in tools
        }
    data = Dataset(
        name="scale47k", corpus=corpus, queries={s: "" for s in sessions}, qrels={"train": sessions}
    )
    return data, {"base_tools": len(bases), "providers": n_providers, "co_usage_sets": len(sets)}


def latency(model: TargetedLM, prompts: list[list[int]], codebook: ToolCodebook, pad: int, eos: int) -> dict:
    """p50 / p99 ms of one query's trie-constrained top-10 (10 beams), after a warm-up call."""
    trie = codebook.trie()
    constrained_top_k(model, prompts[:1], trie, 10, pad, num_beams=10, end_token=eos)
    times = []
    for prompt in prompts:
        started = time.perf_counter()
        hits = constrained_top_k(model, [prompt], trie, 10, pad, num_beams=10, end_token=eos)
        times.append((time.perf_counter() - started) * 1000)
        assert len(hits[0]) == 10 and all(codebook.tool_of(codebook.codes[t]) == t for t, _ in hits[0])
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}


def cell(value: float) -> str:
    """Counts as integers with thousands separators, everything else to 4 significant digits."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.4g}"


def embedding_mb(rows: int, hidden: int, tied: bool, bytes_per: int = 4) -> float:
    return rows * hidden * bytes_per * (1 if tied else 2) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", type=int, default=48)
    parser.add_argument("--sessions", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--levels", type=int, default=2)
    parser.add_argument("--codebook-size", type=int, default=1024)
    parser.add_argument("--encoder-max-length", type=int, default=64, help="tool-text tokens MiniLM reads")
    parser.add_argument(
        "--epochs", type=int, default=3, help="quantizer epochs (one pass over the tools each)"
    )
    parser.add_argument("--sinkhorn-iters", type=int, default=20)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    import transformers

    quiet_libraries()
    torch.manual_seed(0)
    started = time.perf_counter()
    data, sizes = assemble(args.providers, args.sessions)
    n = len(data.corpus)
    print(
        f"{n} tools, {len(data.qrels['train'])} sessions ({time.perf_counter() - started:.0f} s)", flush=True
    )
    init_ray({"num_cpus": 2, "progress_bars": False})
    L, K = args.levels, args.codebook_size
    method = ToolWeaverMethod(
        levels=L,
        codebook_size=K,
        embed_actors=2,
        encoder_max_length=args.encoder_max_length,
        passes_per_epoch=1,
        sinkhorn_iters=args.sinkhorn_iters,
        stages={"codes": {"epochs": args.epochs, "batch_size": 1024, "lr": 1.0e-3}},
    )
    work = tempfile.mkdtemp(prefix="tw-scale-")
    run = RunSpec(
        name="scale47k", storage_path=os.path.join(work, "runs"), local_dir=os.path.join(work, "local")
    )
    codes = method.fit("codes", data, run)
    print({k: round(v, 4) for k, v in codes.items()}, flush=True)
    code_rows = {code[:i] for code in method.tool_codes.values() for i in range(1, L + 1)}  # trie nodes

    # LMs: the scratch Llama of workflows/configs/toollens_toolgen.yaml, and SmolLM2-135M's sizes.
    toollens = load_dataset(os.path.join(SHARED, "toollens"))
    texts = [r["text"] for r in toollens.corpus.values()] + list(toollens.queries.values())[:5000]
    spec = LMSpec(
        vocab_size=4000, hidden_size=256, num_layers=4, num_heads=4, intermediate_size=768, max_length=192
    )
    smollm = transformers.AutoConfig.from_pretrained(resolve_lm("smollm2-135m"))
    prompts_text = [toollens.queries[q] for q in list(toollens.qrels["test"])[: args.queries]]
    rows = []
    for kind in ("toolweaver", "toolgen"):
        lm, tokenizer = build_causal_lm(spec, texts, seed=0)
        lm.eval()
        adding = time.perf_counter()  # not `started`: that one times the whole run (its "seconds")
        if kind == "toolweaver":
            ids = add_code_tokens(lm, tokenizer, L, K)
            codebook = ToolCodebook(
                {t: [ids[level][c] for level, c in enumerate(code)] for t, code in method.tool_codes.items()}
            )
            new_tokens, trie_nodes = L * K, len(code_rows)
        else:
            codebook = add_tool_tokens(lm, tokenizer, td.tool_names(data.corpus, list(data.corpus)))
            new_tokens, trie_nodes = n, n
        add_seconds = time.perf_counter() - adding
        prompter = td.Prompter(tokenizer)
        prompts = [prompter.retrieval(q, 48) for q in prompts_text]
        with torch.no_grad():
            timing = latency(
                TargetedLM(lm), prompts, codebook, tokenizer.pad_token_id, tokenizer.eos_token_id
            )
        metrics = {
            "tools": float(n),
            "new_tokens": float(new_tokens),
            "trie_nodes": float(trie_nodes),
            "add_tokens_seconds": add_seconds,
            "embedding_growth_mb_scratch_lm": embedding_mb(new_tokens, spec.hidden_size, tied=True),
            "embedding_growth_mb_smollm2": embedding_mb(
                new_tokens, smollm.hidden_size, bool(smollm.tie_word_embeddings)
            ),
            **timing,
        }
        if kind == "toolweaver":
            metrics |= {
                "collision_rate_before_pass": codes["collision_rate_before_pass"],
                "collision_rate": codes["collision_rate_after_pass"],
                "assign_seconds": codes["assign_seconds"],
                "embed_seconds": codes["embed_seconds"],
                "quantizer_train_seconds": codes["stage_seconds"],
                "first_level_codes_used": codes["first_level_codes_used"],
                "co_used_first_level_shared": codes["co_used_first_level_shared"],
            }
        rows.append(
            {
                "method": kind,
                "config": {"levels": L, "codebook_size": K} if kind == "toolweaver" else {},
                "split": "scale47k",
                "metrics": metrics,
            }
        )
        print(kind, {k: round(v, 3) for k, v in metrics.items()}, flush=True)
    notes = (
        f"Catalog: {sizes['base_tools']} real tools (ToolLens + LiveMCPBench) x {sizes['providers']} "
        f"providers = {n:,} tools; co-usage from {args.sessions:,} sessions drawn from "
        f"{sizes['co_usage_sets']:,} real multi-tool sets (ToolLens train queries, LiveMCPBench tasks); "
        "how it is built: the docstring of `benchmarks/toolweaver_scale.py`.\n\n"
        "ToolWeaver's codes stage ran as `toolscout train` runs it "
        f"(MiniLM reading {args.encoder_max_length} "
        f"tokens of each tool text, Ray Data embedding with 2 actors, {args.epochs} quantizer epochs of "
        f"batch 1,024, {args.sinkhorn_iters} Sinkhorn iterations, "
        "one Ray Train worker, 2-core machine). Latency: one query per call, 10 beams, top 10, on the "
        "same untrained 4-layer 256-wide scratch Llama for both (the weights do not change the cost), "
        f"{args.queries} ToolLens test queries. Embedding growth: new rows x hidden x 4 bytes (fp32), "
        "twice where input and output embeddings are not tied.\n"
    )
    columns = list(dict.fromkeys(k for r in rows for k in r["metrics"]))
    body = [[c, *(cell(r["metrics"][c]) if c in r["metrics"] else "" for r in rows)] for c in columns]
    report = {
        "dataset": "scale47k (ToolLens + LiveMCPBench, x providers)",
        "results": rows,
        "notes": notes,
        "seconds": time.perf_counter() - started,
    }
    write_report(
        report,
        args.out,
        title="ToolWeaver at 47k tools: codes, tokens, trie and decoding latency vs ToolGen",
        plot=False,
        table=md_table(["metric", *(r["method"] for r in rows)], body),
    )


if __name__ == "__main__":
    main()
