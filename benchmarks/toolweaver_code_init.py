"""Where ToolWeaver's code tokens start on a pretrained LM: sampled rows or the tools' name rows.

ToolWeaver (arXiv 2601.21947) adds L×K shared code tokens. ``code_init: sampled`` starts them all
around the vocabulary's mean row; ``code_init: names`` starts each at the mean name row of the tools
it spells (ToolGen's initialisation, arXiv 2410.03439, carried to shared codes). On SmolLM2 with LoRA
(one H100, toollens_toolweaver_gpu_sampled_curves.md) sampled rows left memorization at 0.07 after four
epochs where ToolGen's name-initialised tokens reached 0.95. This trains both on the same codes,
the same LM and the same schedule (codes, memorization, one retrieval epoch, each a Ray Train
stage) and reports the valid curves: memorization accuracy per epoch, then valid retrieval. Test is
not read: this chooses a setting, it does not report one.

    python benchmarks/toolweaver_code_init.py [--config workflows/configs/toolweaver_code_init.yaml]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see toolgen.py

from benchmarks.train_curves import epoch_rows, stage_runs, table  # noqa: E402
from components import methods  # noqa: E402
from components.config import load_config  # noqa: E402
from components.data import open_dataset  # noqa: E402
from components.data.quickstart import generate_quickstart  # noqa: E402
from workflows.cli_config import packaged_config  # noqa: E402
from workflows.evaluate import score  # noqa: E402
from workflows.quiet import quiet_libraries  # noqa: E402
from workflows.ray_env import init_ray  # noqa: E402
from workflows.report import write_report  # noqa: E402
from workflows.train import fit_method, run_spec  # noqa: E402

CONFIG = os.path.join(ROOT, "workflows", "configs", "toolweaver_code_init.yaml")


def run_init(cfg: dict[str, Any], data: Any, init: str, stamp: str) -> tuple[list[dict], dict]:
    """Train ToolWeaver with one ``code_init``; its per-epoch valid rows and its final valid row."""
    params = {**cfg["method"]["params"], "code_init": init}
    method = methods.build("toolweaver", params)
    run = run_spec(cfg, f"{data.name}-toolweaver-{init}-{stamp}")
    trained = fit_method(method, data, run)
    curves = [
        row
        for stage, path in stage_runs(run.storage_path, run.name).items()
        if stage != "codes"
        for row in epoch_rows(f"code_init={init}", stage, path)
    ]
    final = {
        "method": f"code_init={init}",
        "config": method.config(),
        "split": "valid",
        "metrics": {
            **score(method, data, "valid", (1, 3, 5)),
            "train_seconds": trained["train_seconds"],
            "code_rows_from_names": float(method.report.get("codes", {}).get("code_rows_from_names", 0)),
        },
    }
    return curves, final


def curve_notes(curves: list[dict[str, Any]]) -> str:
    """The per-epoch valid curves, one :func:`benchmarks.train_curves.table` per ``code_init``."""
    labels = dict.fromkeys(r["method"] for r in curves)
    parts = [f"{label}:\n\n" + table([r for r in curves if r["method"] == label]) for label in labels]
    return "\n\nPer-epoch valid curves.\n\n" + "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--out", default=None, help="results JSON (default: the config's bench.out)")
    args = parser.parse_args()
    quiet_libraries()
    cfg = load_config(args.config, defaults=packaged_config("default"))
    init_ray({"num_cpus": 2, **(cfg.get("ray") or {}), "progress_bars": False})
    generated = cfg["data"]["generate"]
    root = tempfile.mkdtemp(prefix="code-init-")
    generate_quickstart(os.path.join(root, "data"), **generated)
    data = open_dataset(os.path.join(root, "data"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results, curves = [], []
    for init in cfg["bench"]["inits"]:
        rows, final = run_init(cfg, data, init, stamp)
        curves += rows
        results.append(final)
    report = {
        "dataset": f"quickstart (generated: {generated})",
        "select_metric": "valid memorization_acc and ndcg@3",
        "results": results,
        "curves": curves,
        "notes": cfg["bench"]["notes"] + curve_notes(curves),
    }
    write_report(report, args.out or cfg["bench"]["out"], title=cfg["bench"]["title"], plot=False)


if __name__ == "__main__":
    main()
