"""``toolscout retrain``: merge an increment, train a challenger, gate it against the champion.

One round, in order (every registry write comes last, so an interrupted round leaves the
registry as it was):

1. take the retrain lock (:class:`components.registry.RetrainLock`; one round at a time; a hand
   promotion or rollback does not wait for it: the round then keeps its challenger);
2. read the base dataset (``data.path``) and the increment (``--increment``, validated on Ray
   Data; rejects written with file, line and reason) and merge them;
3. carve the splits of the merged data; its ``valid`` split is the holdout of both models;
4. train the challenger on the merged data with the method's stages on Ray Train: a full retrain
   (no warm start yet: encoders trained here build their tokenizer from the data, and dense's ID
   head, MassTool's towers and ToolGen's token table are sized by the catalog; docs/retrain.md);
5. measure champion and challenger on the holdout and decide (:mod:`.gate`);
6. write the merged data under the round's directory, register the challenger (alias
   ``challenger``), promote it if the gate says so, write the merged data as the next round's base
   (``retrain.data_out``), and, if asked, swap the serving app to the new champion;
7. write the decision JSON.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

from components import methods
from components.config import ConfigError
from components.data import io
from components.data.beir import finish_rewrite, rewrite_beir, write_beir
from components.data.loader import load_dataset
from components.data.prepared import is_prepared
from components.data.rejects import DatasetError, RejectLog
from components.data.splits import splits_from_config
from components.registry import ChampionMoved, LockHeld, ModelRegistry, RegistrySettings, RetrainLock
from components.registry.moves import settled_alias
from components.registry.splits import splits_differ
from workflows.report import strict_json
from workflows.retrain.gate import GateSettings, decide, measure
from workflows.retrain.increment import merge, read_increment
from workflows.train import fit_method, model_name, register, run_spec

MOVED = "the champion moved during the round; gate again against the new one"


def retrain(cfg: dict[str, Any], increment: str) -> dict[str, Any]:
    """Run one retrain round; returns (and writes) the decision record.

    Raises:
        LockHeld: another retrain is running.
        DatasetError: the base or the increment cannot be read, or ``data.strict`` and a row was
            rejected (the increment's rejects file is written first; in the base, the first
            rejected row stops the load and is named in the error).
    """
    rcfg = cfg.get("retrain") or {}
    data = cfg["data"]
    if not ((cfg.get("registry") or {}).get("model_name") or data.get("name")):
        # train's default name comes from the data directory's name, which changes between rounds
        # (retrain.data_out): a round would look up a model with no champion, and its first
        # challenger would be promoted with nothing to beat.
        raise ConfigError(
            "retrain needs a model name that stays the same between rounds: set "
            "registry.model_name (the name the champion was registered under) or data.name"
        )
    settings = RegistrySettings.from_config(cfg.get("registry"))
    gate = GateSettings.from_config(rcfg.get("gate"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = rcfg.get("out") or os.path.join(settings.root, "retrains", stamp)
    # The round's own files (rejects, merged data, decision) go where the data's storage options
    # reach: an s3:// retrain.out on the data's endpoint.
    options = data.get("storage_options")
    started = time.perf_counter()
    with RetrainLock(settings.retrain_lock):
        if is_prepared(data["path"], options):
            raise DatasetError(
                f"{data['path']}: retrain merges raw BEIR data; pass the dataset, not a prepared dir"
            )
        # The base's rejects are kept apart from the increment's (both name files by their path
        # inside their own directory) and reported: the merged data written below is the next
        # round's base, so a row dropped here without a word would be gone for good.
        finished = finish_rewrite(data["path"], options)
        if finished:
            # The last round registered its model, then stopped while rewriting this base.
            print(f"{data['path']}: finished the last round's rewrite from {finished}", file=sys.stderr)
        base_log = RejectLog()
        strict = bool(data.get("strict"))
        base = load_dataset(
            data["path"], storage_options=options, name=data.get("name"), log=base_log, strict=strict
        )
        if len(base_log):
            base_log.write(io.join(out, "base_rejects.jsonl"), options)
            print(base_log.summary(data["path"]), file=sys.stderr)
        log = RejectLog()
        try:
            inc = read_increment(increment, base, log, rcfg.get("increment_storage_options") or options)
        finally:  # an increment that adds nothing usable still leaves its rejects' reasons
            log.write(io.join(out, "rejects.jsonl"), options)
        if data.get("strict") and len(log):
            raise DatasetError(
                f"{increment}: {len(log)} row(s) rejected (see {io.join(out, 'rejects.jsonl')})"
            )
        merged = merge(base, inc, splits=cfg.get("splits"))
        dataset = splits_from_config(merged, cfg.get("splits"))
        holdout = dataset.qrels["valid"]
        negatives = dataset.neg_split.get("valid", [])
        catalog, new_tools = set(dataset.corpus), inc.new_tools(base)

        name = model_name(cfg, base.name)
        registry = ModelRegistry(settings)
        champion_version = settled_alias(registry, name, "champion")
        if champion_version is None and registry.numbers(name):
            # Only a first round has nothing to beat. Versions without a champion mean the alias
            # was removed or its version deleted: promoting ungated would crown whatever trained.
            raise LookupError(
                f"model {name!r} has versions but no champion; promote the one serving should hold "
                f"(toolscout registry promote {name} N) before retraining"
            )
        if champion_version is not None:
            mismatch = splits_mismatch(registry, champion_version, cfg.get("splits"))
            if mismatch:
                raise ConfigError(mismatch)
        champion_dir = registry.local_dir(champion_version) if champion_version else None

        challenger = methods.build(cfg["method"]["name"], cfg["method"].get("params"))
        # A run of its own even when the config names train.run_name (the champion's training run:
        # resumed, it would hand back the finished old model, trained on the old data).
        run = run_spec(cfg, f"{name}-retrain-{stamp}", scope=f"retrain-{stamp}")
        report = fit_method(challenger, dataset, run)

        measured = {
            "challenger": measure(challenger, holdout, dataset.queries, negatives, catalog, new_tools, gate)
        }
        if champion_dir is not None:
            champion = methods.load(champion_dir)
            measured["champion"] = measure(
                champion, holdout, dataset.queries, negatives, catalog, new_tools, gate
            )
        decision = decide(measured.get("champion"), measured["challenger"], gate)

        if decision.decision == "promoted" and champion_moved(registry, name, champion_version):
            # Gated against a champion that is no longer the champion (moved by hand during the
            # round): promoting would overwrite that decision with one made against another model.
            decision.decision = "kept"
            decision.reasons.append(MOVED)
        # The merged data first, into this round's own directory: a round that fails to write it
        # leaves the registry as it was. The next round's base (retrain.data_out, often the base
        # itself) is written only after the registry writes: written before them, a failed upload
        # left a base that already held the increment and no model trained on it, and every later
        # round rejected the increment as old news.
        staged = io.join(out, "data")
        data_out = rcfg.get("data_out") or staged
        if io.same_path(staged, data["path"]):
            # retrain.out's data is the base itself (a fixed out, chained by --data): stage apart,
            # or the base would hold the increment before any registry write.
            staged = io.join(out, f"data-{stamp}")
        write_beir(merged, staged, options)
        # Registry writes, last: nothing before this point changed what serving or an alias sees.
        tags = {
            "toolscout.retrain": stamp,
            # "promoting" until the alias has moved: a round that dies in between is not listed
            # as promoted while it never was the champion.
            "toolscout.decision": "promoting" if decision.decision == "promoted" else decision.decision,
            "toolscout.increment": increment,
        }
        version = register(registry, cfg, challenger, name, report, tags)
        serving = None

        def record(error: str | None = None) -> dict[str, Any]:
            """What decision.json says: written even when a step after registering fails, since
            by then the registry (and perhaps serving) has changed and the exporter keeps the
            increment until a decision names it."""
            return {
                "model": name,
                "decision": decision.decision,
                "reasons": decision.reasons,
                "interval": decision.interval,
                "guardrails": decision.guardrails,
                "champion": {"version": champion_version.number, **measured["champion"].metrics}
                if champion_version
                else None,
                "challenger": {"version": version.number, **measured["challenger"].metrics},
                "aliases": registry.aliases(name),
                "increment": {
                    "path": increment,
                    **inc.counts(base, merged),
                    "rejects": len(log),
                    "reject_reasons": log.reason_counts(),
                },
                "base_rejects": len(base_log),
                "data_out": data_out,
                "holdout_queries": len(holdout),
                "train_seconds": report["train_seconds"],
                "wall_seconds": time.perf_counter() - started,
                "serving": serving,
                **({"error": error} if error else {}),
            }

        def write(rec: dict[str, Any]) -> None:
            io.write_bytes(io.join(out, "decision.json"), strict_json(rec), options)

        try:
            registry.name_challenger(name, version.number)
            if decision.decision == "promoted":
                blocker = promotion_blocker(registry, version, dataset.queries[next(iter(holdout))])
                if not blocker:
                    try:
                        # The check and the move as one step under the alias lock: a hand move in
                        # between would otherwise be overwritten by a decision made against another
                        # champion.
                        registry.promote(name, version.number, replacing=number_of(champion_version))
                    except ChampionMoved:
                        blocker = MOVED
                    except LockHeld as e:
                        # A move that never ends (its process died on another host): the round keeps
                        # its challenger, tagged and reported, rather than dying after registering it.
                        blocker = f"the alias lock is held: {e}"
                if blocker:
                    decision.decision = "kept"
                    decision.reasons.append(blocker)
                    registry.set_tag(name, version.number, "toolscout.decision", "kept")
            if decision.decision == "promoted":
                registry.set_tag(name, version.number, "toolscout.decision", "promoted")
                if rcfg.get("follow_serving"):
                    # Before the base is written: a failed write must not leave serving on the model
                    # the registry no longer names (its rerun would keep, and never follow).
                    serving = follow_serving(name, rcfg.get("serve_app"))
            if not io.same_path(data_out, staged):
                # Failing here, the registry holds the challenger and the base is as it was: the same
                # increment can be applied again (its rerun registers one more version).
                # Marked while it runs: stopped part-way, the next round finishes it from ``staged``.
                rewrite_beir(merged, data_out, staged, rcfg.get("data_out_storage_options") or options)
        except BaseException as e:  # recorded with what happened so far, then raised
            with contextlib.suppress(Exception):  # the registry itself may be what failed
                write(record(f"{type(e).__name__}: {e}"))
            raise
        done = record()
        write(done)
        return done


def splits_mismatch(registry: ModelRegistry, champion: Any, splits: dict[str, Any] | None) -> str | None:
    """Why the round's splits differ from those the champion was trained with, or None.

    The holdout both models are scored on is the merged data's valid split (carved by
    ``valid_fraction`` and ``seed`` while the base has none), and its no-tool queries are split by
    ``seed`` and ``neg_fractions``: with other settings it holds requests the champion trained on,
    and the gate compares a memorised score with a held-out one."""
    differ = splits_differ(registry, champion, splits)
    if differ is None:
        return None
    return (
        f"splits differ from the champion's (v{champion.number}), as (champion, this round): "
        f"{differ}; its holdout would hold requests the champion trained on. Set splits to the "
        "champion's, or promote a version trained with these by hand"
    )


def promotion_blocker(registry: ModelRegistry, version: Any, query: str) -> str | None:
    """Why a registered challenger the gate promoted must not become the champion, or None:
    serving cannot load the registered files on its default runtime (the gate measured the model
    in memory), and a version it cannot load must not become what it follows. (A champion moved
    meanwhile is caught by the promotion itself, ``promote(replacing=...)``.)"""
    problem = serving_load_problem(registry.local_dir(version), query)
    return f"the registered version does not load as serving loads it: {problem}" if problem else None


def serving_load_problem(path: str, query: str) -> str | None:
    """Why serving could not load the version at ``path`` and answer ``query`` with it, on its
    default encoder runtime (None when it can)."""
    from components.serving.models import DEFAULT_ENCODER_RUNTIME, load_method

    try:
        load_method(path, DEFAULT_ENCODER_RUNTIME).retrieve({"probe": query}, 1)
    except Exception as e:  # any failure is a reason not to promote, reported with the decision
        return f"{type(e).__name__}: {e}"
    return None


def number_of(version: Any) -> int | None:
    return version.number if version else None


def champion_moved(registry: ModelRegistry, name: str, started_with: Any) -> bool:
    """Whether ``name``'s champion is another version than the one the round started with."""
    return number_of(registry.alias(name, "champion")) != number_of(started_with)


def follow_serving(name: str, app_name: str | None = None) -> dict[str, Any]:
    """Swap the running Serve app (on the Ray cluster this job is connected to) to the champion."""
    from components.serving.deploy import APP_NAME
    from components.serving.swap import follow_model

    try:
        pinned = follow_model(f"models:/{name}@champion", app_name or APP_NAME)
    except Exception as e:  # no Serve on this cluster, or no such app: the promotion stands
        return {"followed": False, "reason": f"{type(e).__name__}: {e}"}
    return {"followed": True, "artifact": pinned}
