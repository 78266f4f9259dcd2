"""Starting or joining Ray, in entry points only (the library never calls ``ray.init``)."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

# Ray Train's controller checks its workers every 2 s by default, so a finished stage is noticed up
# to 2 s late and every run pays that again at start-up; measured on 2 cores, a 1-epoch tiny stage
# took 15.5 s at the default and 11.4 s at 0.1 s. For the Ray this program starts itself, poll at
# 0.2 s (one cheap actor call per poll). A cluster keeps its own setting; the environment wins.
TRAIN_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
LOCAL_TRAIN_POLL_S = "0.2"


def init_ray(cfg: dict[str, Any] | None = None) -> None:
    """Join the cluster named by ``ray.address`` / ``RAY_ADDRESS``, or start a local Ray (always,
    with ``local: true``).

    A local Ray binds to 127.0.0.1, its dashboard included, so the quickstart and the tests open no
    port beyond loopback. The dashboard is not there to be looked at: it serves the State API,
    which Ray Train's PlacementGroupCleaner polls to release a run's placement group when the run's
    controller dies without finishing (a Tune trial stopped by ASHA); without it that group's CPUs
    stay reserved and the next trial waits for them forever. Under ``ray job submit`` the job's
    driver joins its cluster.
    """
    if ray.is_initialized():
        return
    cfg = cfg or {}
    if cfg.get("local"):
        # A benchmark's own Ray (``local: true``): joining the cluster RAY_ADDRESS names, its
        # ``serve.shutdown()`` removed every Serve app there. Dropped from the environment too, so a
        # ``serve.start`` or a child process started from here does not join it either.
        os.environ.pop("RAY_ADDRESS", None)
    address = None if cfg.get("local") else cfg.get("address") or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
        return
    # Set before ray.init: the local raylet, and with it every worker, inherits this environment.
    os.environ.setdefault(TRAIN_POLL_ENV, LOCAL_TRAIN_POLL_S)
    ray.init(
        num_cpus=cfg.get("num_cpus"),
        num_gpus=cfg.get("num_gpus"),  # None: the GPUs Ray detects
        # ``ray.include_dashboard: false`` for a minimal Ray install (no ``ray[default]`` packages):
        # training and benchmarks run without it; Tune sweeps with ASHA want it (see above).
        include_dashboard=bool(cfg.get("include_dashboard", True)),
        dashboard_host="127.0.0.1",
        dashboard_port=int(cfg.get("dashboard_port") or 0) or None,  # None: 8265, or the next free port
        logging_level=logging.WARNING,
        log_to_driver=bool(cfg.get("log_to_driver", False)),
        _node_ip_address="127.0.0.1",
    )
    quiet_data_progress(cfg.get("progress_bars", True))


def quiet_data_progress(show_bars: bool) -> None:
    """Keep Ray Data's progress bars but drop its per-operator log spam."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = show_bars
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def logs_dir() -> str | None:
    """Where this Ray session's own logs are (workers, Ray Train and Ray Data); None if unknown.

    Only a Ray started by this process knows it (``ray._private``: there is no public accessor).
    """
    node = getattr(ray._private.worker, "_global_node", None)
    try:
        return node.get_logs_dir_path() if node is not None else None
    except Exception:  # private API: a missing method must not fail a run
        return None
