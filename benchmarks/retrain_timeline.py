"""Scheduled retraining on ToolLens, simulated: a champion, two increments, the gate, a live swap.

The timeline (every part carved from ToolLens's *train* file; test is never read):

- round 0: ~10 % of the tools are held back (hashed by id, seed 0) and the champion is trained
  on ~70 % of the training queries, all of them answerable without a held-back tool;
- round 1: increment 1 brings the remaining queries that need no held-back tool (more usage);
- round 2: increment 2 brings the held-back tools and every query that needs one.

Each round runs ``toolscout retrain``'s job (:func:`workflows.retrain.job.retrain`): validate and
merge the increment on Ray Data, train a challenger on Ray Train, measure champion and challenger
on the merged data's valid split (the same holdout for both), decide by a paired bootstrap and the
guardrails, register, promote if better. The Serve app follows the champion
(``models:/<name>@champion``): a paced load runs through the whole round, the swap included, and
every failed request is counted.

    python benchmarks/retrain_timeline.py [--source ../shared/datasets/toollens] [--rate 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

import requests

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.config import load_config
from components.data.beir import write_beir
from components.data.loader import load_dataset
from components.data.splits import held_out_tools, unit_hash
from components.data.types import Dataset
from components.registry import ModelRegistry, RegistrySettings
from workflows.cli_config import packaged_config
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "toollens_retrain.json")
CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "workflows",
    "configs",
    "toollens_retrain.yaml",
)


def timeline(source: str, work: str, held_back: float, base_share: float, seed: int) -> dict[str, Any]:
    """Write the base dataset and the two increments under ``work``; returns their paths and sizes."""
    data = load_dataset(source, ["train"], name="toollens")
    hidden = held_out_tools(sorted(data.corpus), held_back, seed)
    train = data.qrels["train"]
    needs_hidden = {q for q, rel in train.items() if hidden.intersection(rel)}
    answerable = [q for q in train if q not in needs_hidden]
    # ~base_share of all training queries, drawn from those the base catalog can answer.
    share = min(1.0, base_share * len(train) / len(answerable))
    base_q = {q for q in answerable if unit_hash(seed + 1, q) < share}
    more_q = set(answerable) - base_q

    def subset(queries: set[str], tools: set[str] | None) -> Dataset:
        corpus = {t: r for t, r in data.corpus.items() if tools is None or t in tools}
        return Dataset(
            "toollens",
            corpus,
            {q: data.queries[q] for q in queries},
            {"train": {q: train[q] for q in queries}},
        )

    base_tools = set(data.corpus) - hidden
    paths = {
        "base": os.path.join(work, "base"),
        "inc1": os.path.join(work, "increment-1"),
        "inc2": os.path.join(work, "increment-2"),
    }
    base = subset(base_q, base_tools)
    base.neg_queries = list(data.neg_queries)
    write_beir(base, paths["base"])
    write_beir(subset(more_q, set()), paths["inc1"])  # queries + qrels only: no new tools
    os.remove(os.path.join(paths["inc1"], "corpus.jsonl"))  # (an empty file would be rejected)
    write_beir(subset(needs_hidden, hidden), paths["inc2"])  # the held-back tools and their queries
    sizes = {
        "tools": len(data.corpus),
        "held_back_tools": len(hidden),
        "train_queries": len(train),
        "base_queries": len(base_q),
        "increment_1_queries": len(more_q),
        "increment_2_queries": len(needs_hidden),
    }
    return {"paths": paths, "sizes": sizes}


class PacedLoad:
    """Requests at ``rate`` per second from one thread until stopped (at most ``max_seconds``),
    recording each status and the model version that answered."""

    def __init__(self, url: str, bodies: list[dict], rate: float, max_seconds: float = 3600.0) -> None:
        self.url, self.bodies, self.rate, self.max_seconds = url, bodies, rate, max_seconds
        self.statuses: list[int] = []
        self.versions: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        session = requests.Session()
        started = time.monotonic()
        i = 0
        while not self._stop.is_set() and time.monotonic() - started < self.max_seconds:
            body = self.bodies[i % len(self.bodies)]
            try:
                r = session.post(f"{self.url}/v1/select", json=body, timeout=30)
                self.statuses.append(r.status_code)
                if r.status_code == 200:
                    self.versions.append(r.json()["model_version"])
            except requests.RequestException:
                self.statuses.append(-1)
            i += 1
            self._stop.wait(max(0.0, started + i / self.rate - time.monotonic()))

    def __enter__(self) -> PacedLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        return {
            "requests": len(self.statuses),
            "errors": sum(1 for s in self.statuses if s != 200),
            "versions": list(dict.fromkeys(self.versions)),
        }


def start_serving(name: str, cfg: dict[str, Any], catalog: str, port: int) -> str:
    """Serve ``models:/<name>@champion`` (MassTool detects and retrieves) on 127.0.0.1:``port``,
    as ``toolscout serve`` does."""
    from workflows.serve import app_args, read_serve_config, run_server

    file = read_serve_config(None)
    args = app_args(file, {"artifact": f"models:/{name}@champion", "catalog": catalog}, [])
    args["registry"] = RegistrySettings.from_config(cfg.get("registry")).as_config()
    return run_server(args, "127.0.0.1", port, file, blocking=False)


def round_row(label: str, record: dict[str, Any], load: dict[str, Any] | None) -> dict[str, Any]:
    interval = record.get("interval") or {}
    metrics = {
        "champion_ndcg@3": (record.get("champion") or {}).get("ndcg@3", float("nan")),
        "challenger_ndcg@3": record["challenger"]["ndcg@3"],
        "champion_recall@3": (record.get("champion") or {}).get("recall@3", float("nan")),
        "challenger_recall@3": record["challenger"]["recall@3"],
        "diff_mean": interval.get("mean", float("nan")),
        "diff_low": interval.get("low", float("nan")),
        "diff_high": interval.get("high", float("nan")),
        "holdout_queries": float(record["holdout_queries"]),
        "wall_seconds": record["wall_seconds"],
        "train_seconds": record["train_seconds"],
        "errors": float(load["errors"]) if load else float("nan"),
        "requests": float(load["requests"]) if load else float("nan"),
    }
    config = {
        "round": label,
        "decision": record["decision"],
        "reasons": record["reasons"],
        "increment": record["increment"],
        "aliases": record["aliases"],
        "served_versions": load["versions"] if load else [],
    }
    return {"method": "masstool", "config": config, "split": "valid", "metrics": metrics}


def cell(value: float, fmt: str) -> str:
    """A table cell: ``value`` formatted, or "-" where the round has no such figure (NaN)."""
    return "-" if value != value else format(value, fmt)


def markdown(report: dict[str, Any]) -> str:
    head = ["round", "increment", "champion N@3", "challenger N@3", "Δ N@3 [95% CI]", "decision", "wall s"]
    head += ["requests", "errors", "served"]
    rows = []
    for r in report["results"]:
        m, c = r["metrics"], r["config"]
        inc = c["increment"]
        what = "-" if not inc else f"+{inc.get('new_queries', 0)} queries, +{inc.get('new_tools', 0)} tools"
        ci = "-"
        if m["diff_mean"] == m["diff_mean"]:
            ci = f"{m['diff_mean']:+.4f} [{m['diff_low']:+.4f}, {m['diff_high']:+.4f}]"
        rows.append(
            [
                c["round"],
                what,
                cell(m["champion_ndcg@3"], ".4f"),
                cell(m["challenger_ndcg@3"], ".4f"),
                ci,
                c["decision"],
                cell(m["wall_seconds"], ".0f"),
                cell(m["requests"], ".0f"),
                cell(m["errors"], ".0f"),
                " → ".join(c["served_versions"]) or "-",
            ]
        )
    lines = md_table(head, rows)
    reasons = [f"- {r['config']['round']}: " + "; ".join(r["config"]["reasons"]) for r in report["results"]]
    return "\n".join(lines) + "\n\nReasons:\n\n" + "\n".join(reasons) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default="../shared/datasets/toollens")
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--work", default=None, help="Scratch dir (default: a temporary one, removed).")
    parser.add_argument("--rate", type=float, default=10.0, help="Paced requests per second during rounds.")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    a = parser.parse_args()
    if not os.path.exists(os.path.join(a.source, "corpus.jsonl")):
        sys.exit(f"ToolLens not found at {a.source}")

    from workflows.ray_env import init_ray
    from workflows.retrain.job import retrain
    from workflows.train import train

    work = a.work or tempfile.mkdtemp(prefix="toolscout-retrain-")
    cfg = load_config(a.config, a.overrides, packaged_config("default"))
    cfg["registry"]["root"] = os.path.join(work, "registry")
    plan = timeline(a.source, work, 0.1, 0.7, int(cfg["splits"]["seed"]))
    print(json.dumps(plan["sizes"]))
    init_ray({**(cfg.get("ray") or {}), "local": True})  # its serve.shutdown() is for its own Ray
    rows = []
    try:
        started = time.perf_counter()
        first = train({**cfg, "data": {**cfg["data"], "path": plan["paths"]["base"]}})
        name = first["model"]
        registry = ModelRegistry(RegistrySettings.from_config(cfg["registry"]))
        record0 = {
            "decision": "promoted",
            "reasons": ["round 0: the first model of its name is the champion"],
            "interval": None,
            "challenger": {"ndcg@3": float("nan"), "recall@3": float("nan")},
            "increment": {},
            "aliases": registry.aliases(name),
            "holdout_queries": 0,
            "wall_seconds": time.perf_counter() - started,
            "train_seconds": first["train_seconds"],
        }
        rows.append(round_row("0: base", record0, None))
        url = start_serving(name, cfg, plan["paths"]["base"], a.port)
        base_path = plan["paths"]["base"]
        data = load_dataset(base_path, ["train"])
        bodies = [{"query": t, "top_k": 3} for t in list(data.queries.values())[:200]]
        for label, inc in (("1: more queries", "inc1"), ("2: held-back tools", "inc2")):
            round_cfg = {
                **cfg,
                "data": {**cfg["data"], "path": base_path},
                "retrain": {
                    **cfg.get("retrain", {}),
                    "out": os.path.join(work, f"round-{label[0]}"),
                    "follow_serving": True,
                },
            }
            with PacedLoad(url, bodies, a.rate) as load:
                record = retrain(round_cfg, plan["paths"][inc])
                time.sleep(3.0)  # requests after the swap, on the version it installed
            rows.append(round_row(label, record, load.summary()))
            print(json.dumps(rows[-1], default=str))
            base_path = record["data_out"]
    finally:
        from ray import serve

        serve.shutdown()
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report = {
        "dataset": "toollens",
        "notes": (
            f"Timeline sizes: {json.dumps(plan['sizes'])}. Holdout: each round's merged valid split "
            "(10 % of its training queries by hashed id, never trained on by either model). "
            f"Serving: models:/{name}@champion through Serve's proxy, paced at {a.rate:g} req/s "
            "through each round (training included) and the swap.\n"
            f"Run: python benchmarks/retrain_timeline.py --config {os.path.relpath(a.config)} "
            "(2 cores, CPU)\n"
        ),
        "results": rows,
    }
    write_report(
        report,
        a.out,
        title="ToolLens: scheduled retraining, champion vs challenger",
        plot=False,
        table=markdown(report),
    )
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
