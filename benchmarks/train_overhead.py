"""Ray Train overhead: one dense training stage through ``TorchTrainer`` and as plain PyTorch.

Both runs use the same task, batches, optimizer, validation and per-epoch checkpoint files
(:func:`components.training.loop.run_epoch`), the same two CPU threads, in the same process
run, one after the other. The Ray run's time includes starting the trainer, its worker and the
checkpoint uploads; Ray itself is started before either run.

    python benchmarks/train_overhead.py [--data ../shared/datasets/toollens] [--epochs 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import ray
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.data import open_dataset
from components.methods.dense.method import DenseMethod
from components.training.plain import train_in_process
from components.training.runner import run_stage
from components.training.spec import RunSpec
from workflows.ray_env import init_ray
from workflows.report import md_table, write_report

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "train_overhead.json")
PARAMS = {
    "epochs": 1,
    "lr": 1e-3,
    "batch_size": 64,
    "tool_max_length": 64,
    "encoder": {
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 4,
        "intermediate_size": 512,
        "max_length": 48,
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/datasets/toollens")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    init_ray({"num_cpus": 2, "progress_bars": False})
    import transformers

    transformers.logging.set_verbosity_error()
    data = open_dataset(args.data)
    method = DenseMethod(**{**PARAMS, "epochs": args.epochs})
    work = tempfile.mkdtemp(prefix="overhead-")
    init = os.path.join(work, "init")
    method.initial_model(data, init, seed=0)
    stage = method.stage_config(init, data)

    torch.set_num_threads(2)
    started = time.perf_counter()
    plain_history = train_in_process(stage, os.path.join(work, "plain"))
    plain = time.perf_counter() - started

    run = RunSpec(
        name="overhead",
        storage_path=os.path.join(work, "store"),
        local_dir=os.path.join(work, "local"),
        resources_per_worker={"CPU": 2},
    )
    started = time.perf_counter()
    result = run_stage(method.stage_config(init, ray.put(data)), run)
    with_ray = time.perf_counter() - started

    # PARAMS first: its own "epochs" (1) must not overwrite the epochs this run trained.
    config = {**PARAMS, "dataset": data.name, "epochs": args.epochs, "threads": 2, "epochs_run": args.epochs}
    rows = [
        {
            "method": "plain pytorch (in process)",
            "config": config,
            "split": "train",
            "metrics": {
                "seconds": plain,
                "epoch_seconds": plain_history[-1]["epoch_seconds"],
                "valid_ndcg@3": plain_history[-1]["valid_ndcg@3"],
                "ratio": 1.0,
            },
        },
        {
            "method": "ray train (TorchTrainer, 1 worker)",
            "config": config,
            "split": "train",
            "metrics": {
                "seconds": with_ray,
                "epoch_seconds": result.history[-1]["epoch_seconds"],
                "valid_ndcg@3": result.history[-1]["valid_ndcg@3"],
                "ratio": with_ray / plain,
            },
        },
    ]
    for r in rows:
        print(r["method"], {k: round(v, 4) for k, v in r["metrics"].items()})
    report = {
        "dataset": data.name,
        "results": rows,
        "notes": f"2 CPU cores, Ray {ray.__version__}, torch {torch.__version__}; ratio = wall seconds / "
        "plain wall seconds (goal ≤ 1.10); one run each, same process, plain first.\n",
    }
    cells = [
        [
            r["method"],
            f"{r['metrics']['seconds']:.1f}",
            f"{r['metrics']['epoch_seconds']:.1f}",
            f"{r['metrics']['valid_ndcg@3']:.4f}",
            f"{r['metrics']['ratio']:.3f}",
        ]
        for r in rows
    ]
    table = md_table(["run", "wall seconds", "epoch seconds", "valid ndcg@3", "ratio"], cells)
    title = "Ray Train overhead vs plain PyTorch"
    write_report(report, args.out, title=title, plot=False, table=table)


if __name__ == "__main__":
    main()
