"""``toolscout retrain``: the gate keeps a worse challenger and promotes a better one, bad increment
rows go to rejects, an interrupted round leaves the registry as it was, and rollback restores."""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TINY_ENCODER
from typer.testing import CliRunner

from components.config import ConfigError
from components.data.loader import load_dataset
from components.data.quickstart import generate_quickstart
from components.data.splits import split_settings
from components.registry import ModelRegistry, RegistrySettings, RetrainLock
from workflows.cli import app
from workflows.cli_config import build_config
from workflows.retrain import job
from workflows.train import train

runner = CliRunner()
HELD_BACK = 0.3  # share of train queries that arrive later, as the increment


def tsv(rows: list[str]) -> str:
    return "query-id\tcorpus-id\tscore\n" + "".join(r + "\n" for r in rows)


@pytest.fixture(scope="module")
def timeline(tmp_path_factory) -> dict[str, Path]:
    """A generated dataset split into a base (70 % of train queries), an increment (the rest, plus
    two bad rows), and a copy of the base whose train judgements are shuffled across queries."""
    root = tmp_path_factory.mktemp("retrain")
    full = root / "full"
    generate_quickstart(str(full), seed=11, n_queries=700, n_neg=80, wording="shared")
    data = load_dataset(str(full))
    rng = random.Random(0)
    train_q = sorted(data.qrels["train"])
    later = set(rng.sample(train_q, int(len(train_q) * HELD_BACK)))

    base = root / "base"
    shutil.copytree(full, base)
    keep = [q for q in data.queries if q not in later]
    (base / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": data.queries[q]}) + "\n" for q in keep)
    )
    base_train = {q: rel for q, rel in data.qrels["train"].items() if q not in later}
    (base / "qrels" / "train.tsv").write_text(
        tsv([f"{q}\t{t}\t{s}" for q, rel in base_train.items() for t, s in rel.items()])
    )
    (base / "query_scene_train.txt").unlink()  # scenes are optional; the increment brings none

    shuffled = root / "shuffled"
    shutil.copytree(base, shuffled)
    qids = list(base_train)
    targets = [base_train[q] for q in qids]
    rng.shuffle(targets)
    (shuffled / "qrels" / "train.tsv").write_text(
        tsv([f"{q}\t{t}\t{s}" for q, rel in zip(qids, targets, strict=True) for t, s in rel.items()])
    )

    inc = root / "increment"
    (inc / "qrels").mkdir(parents=True)
    rows = [json.dumps({"_id": q, "text": data.queries[q]}) for q in sorted(later)]
    rows.append(json.dumps({"_id": keep[0], "text": "a reused id"}))  # bad: the base has this id
    (inc / "queries.jsonl").write_text("\n".join(rows) + "\n")
    judged = [f"{q}\t{t}\t{s}" for q in sorted(later) for t, s in data.qrels["train"][q].items()]
    judged.append(f"{sorted(later)[0]}\tno-such-tool\t1")  # bad: an unknown tool
    (inc / "qrels" / "train.tsv").write_text(tsv(judged))
    return {"base": base, "shuffled": shuffled, "increment": inc, "root": root}


def config(data: Path, registry: Path, out: Path, **extra) -> dict:
    cfg = build_config(
        None,
        [
            f"data.path={data}",
            f"registry.root={registry}",
            "registry.model_name=tools",
            f"retrain.out={out}",
            "method.name=dense",
            f"train.storage_path={out / 'train'}",
            f"train.local_dir={out / 'ck'}",
            "train.num_workers=0",  # Ray Train's local mode: see LOCAL_MODE in conftest.py
            "retrain.gate.latency_budget_ms=1000",
        ],
    )
    cfg["method"]["params"] = {"encoder": TINY_ENCODER, "epochs": 3, "batch_size": 64, "lr": 3e-3}
    return cfg


def test_increment_rejects_are_reported_with_file_line_and_reason(ray_session, timeline, tmp_path):
    from components.data.rejects import DatasetError, RejectLog
    from workflows.retrain.increment import merge, read_increment

    base = load_dataset(str(timeline["base"]))
    log = RejectLog()
    inc = read_increment(str(timeline["increment"]), base, log)
    reasons = {(r.file, r.reason.split(" (")[0].split(";")[0]) for r in log.rejects}
    assert ("queries.jsonl", f"query id {next(iter(base.queries))!r} is already in the base data") in reasons
    assert any(f == "qrels/train.tsv" and "unknown corpus-id 'no-such-tool'" in r for f, r in reasons)
    assert all(r.line > 0 for r in log.rejects) and len(log) == 2
    merged = merge(base, inc)
    assert len(merged.qrels["train"]) == len(base.qrels["train"]) + len(inc.qrels["train"])
    assert set(base.queries) < set(merged.queries) and merged.corpus == base.corpus
    # The same increment again, on the data it was merged into: every row is old news.
    with pytest.raises(DatasetError, match="adds nothing usable"):
        read_increment(str(timeline["increment"]), merged, RejectLog())


def test_an_increment_with_valid_judgements_grows_the_holdout_and_keeps_the_bases(
    ray_session, timeline, tmp_path
):
    from components.data.rejects import RejectLog
    from components.data.splits import same_request, splits_from_config
    from workflows.retrain.increment import merge, read_increment

    base = load_dataset(str(timeline["base"]))
    inc_dir = tmp_path / "inc"
    shutil.copytree(timeline["increment"], inc_dir)
    train_rows = (inc_dir / "qrels" / "train.tsv").read_text().splitlines()
    (inc_dir / "qrels" / "valid.tsv").write_text(tsv(train_rows[1:4]))  # these queries also in train
    log = RejectLog()
    inc = read_increment(str(inc_dir), base, log)
    moved = {row.split("\t")[0] for row in train_rows[1:4]}
    assert set(inc.qrels["valid"]) == moved and not moved & set(inc.qrels["train"])
    repeated = [r for r in log.rejects if "judged in qrels/valid.tsv too" in r.reason]
    assert {(r.file, r.line) for r in repeated} == {("qrels/train.tsv", n) for n in (2, 3, 4)}
    # The base's holdout is what the base alone is split into; the increment's valid queries join it.
    base_holdout = set(splits_from_config(base, None).qrels["valid"])
    grown = splits_from_config(merge(base, inc), None)
    # So do the increment's training queries that repeat a holdout request (this wording repeats).
    held = {same_request(grown.queries[q]) for q in base_holdout | moved}
    twins = {q for q in inc.qrels["train"] if same_request(inc.queries[q]) in held}
    assert twins and set(grown.qrels["valid"]) == base_holdout | moved | twins
    assert not set(grown.qrels["valid"]) & set(grown.qrels["train"])
    # The decision's counts say where the merge put them, and a tool sent again unchanged is no
    # update (before: every training query counted as trained on, every resent tool as updated).
    resent = {**inc.tools, next(iter(base.corpus)): base.corpus[next(iter(base.corpus))]}
    counts = replace(inc, tools=resent).counts(base, merge(base, inc))
    assert counts["train_judged_queries"] == len(inc.qrels["train"]) - len(twins)
    assert counts["valid_judged_queries"] == len(moved) + len(twins)
    assert counts["updated_tools"] == inc.counts(base)["updated_tools"]  # the resent one adds none


def retrain_cli(timeline: dict[str, Path], registry_root: Path, *extra: str):
    """``toolscout retrain`` of the timeline's increment onto its base, in this process."""
    argv = ["retrain", "--increment", str(timeline["increment"]), "--data", str(timeline["base"])]
    return runner.invoke(app, [*argv, f"registry.root={registry_root}", *extra])


def test_better_challenger_is_promoted_and_worse_one_kept(ray_session, timeline, tmp_path):
    registry_root = tmp_path / "registry"
    # Round 0: a champion trained on shuffled judgements (it has nothing to beat).
    first = train(config(timeline["shuffled"], registry_root, tmp_path / "r0"))
    registry = ModelRegistry(RegistrySettings(root=str(registry_root)))
    assert registry.aliases("tools") == {"champion": first["version"]}

    # Round 1: the real judgements plus the increment beat it on the holdout.
    record = job.retrain(config(timeline["base"], registry_root, tmp_path / "r1"), str(timeline["increment"]))
    assert record["decision"] == "promoted", record["reasons"]
    assert record["interval"]["low"] > 0
    assert registry.aliases("tools") == {"champion": 2, "previous": 1}
    assert record["increment"]["rejects"] == 2 and record["increment"]["new_queries"] > 0
    rejects = [json.loads(line) for line in (tmp_path / "r1" / "rejects.jsonl").read_text().splitlines()]
    assert {r["file"] for r in rejects} == {"queries.jsonl", "qrels/train.tsv"}
    assert json.loads((tmp_path / "r1" / "decision.json").read_text())["decision"] == "promoted"
    merged = load_dataset(record["data_out"])  # the next round's base
    assert len(merged.qrels["train"]) > len(load_dataset(str(timeline["base"])).qrels["train"])

    # Round 2: a challenger trained on shuffled judgements, barely (lr 1e-6), loses; the champion
    # stays. (At the champion's lr the increment's real judgements, 30 % of the data, left it
    # within the interval's noise of the champion on a holdout that repeats no training request.)
    worse = config(timeline["shuffled"], registry_root, tmp_path / "r2")
    worse["method"]["params"]["lr"] = 1e-6
    record = job.retrain(worse, str(timeline["increment"]))
    assert record["decision"] == "kept" and record["interval"]["high"] < 0
    assert registry.aliases("tools") == {"champion": 2, "previous": 1, "challenger": 3}
    assert registry.version("tools", 3).tags["toolscout.decision"] == "kept"

    # Rollback (the CLI) restores the previous champion; a second one undoes it.
    reg = f"registry.root={registry_root}"
    result = runner.invoke(app, ["registry", "rollback", "tools", reg])
    assert result.exit_code == 0, result.output
    assert registry.aliases("tools")["champion"] == 1
    runner.invoke(app, ["registry", "rollback", "tools", reg])
    assert registry.aliases("tools")["champion"] == 2


def interrupted(*args, **kwargs):
    raise KeyboardInterrupt  # Ctrl-C, or the node going away


def disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")


# Stopped in training, failing to write the merged data (after the gate) or failing to register:
# either way no version, no alias moved, no decision recorded, and the base (here also the next
# round's base, as the scheduled rounds run) still without the increment, so it can be applied again.
@pytest.mark.parametrize(
    ("step", "failure"), [("fit_method", interrupted), ("write_beir", disk_full), ("register", disk_full)]
)
def test_an_interrupted_retrain_leaves_the_registry_and_the_base_as_they_were(
    ray_session, timeline, tmp_path, monkeypatch, step, failure
):
    registry_root = tmp_path / "registry"
    current = tmp_path / "current"
    shutil.copytree(timeline["base"], current)
    champion = config(current, registry_root, tmp_path / "r0")
    train({**champion, "method": {"name": "bm25", "params": {}}})  # any method can be the champion
    registry = ModelRegistry(RegistrySettings(root=str(registry_root)))
    before = ([v.number for v in registry.versions("tools")], registry.aliases("tools"))

    monkeypatch.setattr(job, step, failure)
    cfg = config(current, registry_root, tmp_path / "r1")
    cfg["retrain"]["data_out"] = str(current)
    with pytest.raises((KeyboardInterrupt, OSError)):
        job.retrain(cfg, str(timeline["increment"]))
    assert ([v.number for v in registry.versions("tools")], registry.aliases("tools")) == before
    assert RetrainLock(str(registry_root / "retrain.lock")).holder() is None
    assert not (tmp_path / "r1" / "decision.json").exists()
    assert load_dataset(str(current)).queries == load_dataset(str(timeline["base"])).queries


def test_a_retrain_without_a_stable_model_name_is_refused(timeline, tmp_path):
    # The data directory's name changes between rounds: a name derived from it would find no
    # champion and promote the first challenger with nothing to beat.
    from components.config import ConfigError

    cfg = config(timeline["base"], tmp_path / "registry", tmp_path / "r1")
    cfg["registry"]["model_name"] = None
    with pytest.raises(ConfigError, match=r"registry\.model_name"):
        job.retrain(cfg, str(timeline["increment"]))
    cfg["data"]["name"] = "tools"  # a dataset name is as stable
    held = RetrainLock(str(tmp_path / "registry" / "retrain.lock"))
    with held, pytest.raises(Exception, match="another retrain holds"):
        job.retrain(cfg, str(timeline["increment"]))  # past the name check, up to the lock


def test_a_second_retrain_is_refused_while_one_runs(ray_session, timeline, tmp_path):
    registry_root = tmp_path / "registry"
    with RetrainLock(str(registry_root / "retrain.lock")):
        result = retrain_cli(timeline, registry_root, "registry.model_name=tools")
    assert result.exit_code == 1 and "another retrain holds" in " ".join(result.output.split())


def first_round(timeline, tmp_path: Path) -> tuple[dict, ModelRegistry]:
    """A first round's config (no champion yet, so BM25, which needs no training, is promoted)
    that writes the next base to a copy of the base, and the registry it writes to."""
    current = tmp_path / "current"
    shutil.copytree(timeline["base"], current)
    cfg = config(current, tmp_path / "registry", tmp_path / "r0")
    cfg["method"] = {"name": "bm25", "params": {}}
    cfg["retrain"]["data_out"] = str(current)
    return cfg, ModelRegistry(RegistrySettings(root=str(tmp_path / "registry")))


def test_a_promotion_that_fails_leaves_its_version_tagged_promoting_not_promoted(
    ray_session, timeline, tmp_path, monkeypatch
):
    cfg, registry = first_round(timeline, tmp_path)
    monkeypatch.setattr(ModelRegistry, "promote", disk_full)
    with pytest.raises(OSError):
        job.retrain(cfg, str(timeline["increment"]))
    (version,) = registry.versions("tools")
    assert "champion" not in registry.aliases("tools")
    assert version.tags["toolscout.decision"] == "promoting"  # before: "promoted", yet never champion


def test_serving_follows_a_promotion_before_the_next_base_is_written(
    ray_session, timeline, tmp_path, monkeypatch
):
    # A failed write of the next base used to come first: the champion had moved, serving stayed
    # on the old one, and the rerun (same data, same model) kept and never followed.
    cfg, registry = first_round(timeline, tmp_path)
    cfg["retrain"]["follow_serving"] = True
    calls = []
    monkeypatch.setattr(
        job, "follow_serving", lambda name, app=None: calls.append(name) or {"followed": True}
    )

    def base_write_fails(dataset, path, *args):
        assert str(path) == cfg["retrain"]["data_out"]  # the staged copy goes through write_beir
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(job, "rewrite_beir", base_write_fails)
    with pytest.raises(OSError):
        job.retrain(cfg, str(timeline["increment"]))
    assert registry.aliases("tools")["champion"] == 1 and calls == ["tools"]
    assert registry.version("tools", 1).tags["toolscout.decision"] == "promoted"
    # The round still says what it did, and why it stopped: no decision.json was written before,
    # so the exporter kept the increment and the next rounds failed on it with no record.
    with open(os.path.join(cfg["retrain"]["out"], "decision.json")) as f:
        record = json.load(f)
    assert record["decision"] == "promoted" and record["challenger"]["version"] == 1
    assert record["serving"] == {"followed": True} and "No space left on device" in record["error"]


def test_a_base_rewrite_stopped_part_way_is_refused_then_finished_by_the_next_round(
    ray_session, timeline, tmp_path, monkeypatch
):
    # The next base is rewritten file by file, after the round registered its model. Stopped
    # part-way, the base held judgements of queries it did not have yet: read with those rows
    # rejected, and under data.strict refused until they were removed by hand.
    from components.data import beir
    from components.data.rejects import DatasetError

    cfg, _ = first_round(timeline, tmp_path)
    base = cfg["retrain"]["data_out"]
    real = beir.io.write_bytes

    def stops_at_the_judgements(path, data, options=None):
        if str(path) == f"{base}/qrels/train.tsv":
            raise OSError(28, "No space left on device")
        return real(path, data, options)

    monkeypatch.setattr(beir.io, "write_bytes", stops_at_the_judgements)
    with pytest.raises(OSError):
        job.retrain(cfg, str(timeline["increment"]))
    monkeypatch.setattr(beir.io, "write_bytes", real)
    with pytest.raises(DatasetError, match="a retrain stopped while rewriting this dataset"):
        load_dataset(base)  # part old, part new: refused by name, not read with rows dropped
    # The next round finishes the rewrite from the stopped round's staged copy first: the same
    # increment is then old news (its model is registered), and no judgement is lost.
    strict = {**cfg, "data": {**cfg["data"], "strict": True}}
    rejects = os.path.join(cfg["retrain"]["out"], "rejects.jsonl")
    os.remove(rejects)  # the stopped round's
    with pytest.raises(DatasetError, match="adds nothing usable"):
        job.retrain(strict, str(timeline["increment"]))
    assert os.path.exists(rejects)  # the refusal counts rejected rows: their reasons are kept
    merged = load_dataset(base, strict=True)
    assert len(merged.qrels["train"]) > len(load_dataset(str(timeline["base"])).qrels["train"])
    assert set(load_dataset(str(timeline["base"])).queries) < set(merged.queries)


def test_a_retrain_out_whose_data_is_the_base_does_not_overwrite_it_before_registering(
    ray_session, timeline, tmp_path, monkeypatch
):
    # retrain.out fixed and the base chained as <out>/data: staging the merged data there wrote
    # the next base before the registry writes, so a failed registration consumed the increment.
    out = tmp_path / "fixed"
    shutil.copytree(timeline["base"], out / "data")
    cfg = config(out / "data", tmp_path / "registry", out)
    cfg["method"] = {"name": "bm25", "params": {}}
    monkeypatch.setattr(job, "register", disk_full)
    with pytest.raises(OSError):
        job.retrain(cfg, str(timeline["increment"]))
    assert load_dataset(str(out / "data")).queries == load_dataset(str(timeline["base"])).queries


def test_a_model_with_versions_but_no_champion_is_refused_before_training(
    ray_session, timeline, tmp_path, monkeypatch
):
    # The champion's alias removed (or its version deleted): before, the round read as a first one
    # and promoted its challenger with nothing to beat.
    cfg, registry = first_round(timeline, tmp_path)
    train(cfg)  # a first version, promoted
    registry.set_alias("tools", "champion", None)
    assert registry.versions("tools") and "champion" not in registry.aliases("tools")
    monkeypatch.setattr(job, "fit_method", disk_full)  # must not be reached
    with pytest.raises(LookupError, match="has versions but no champion"):
        job.retrain(cfg, str(timeline["increment"]))


class Reached(Exception):
    pass


def test_a_round_finishes_an_alias_move_a_crash_left_half_done_before_reading_the_champion(
    ray_session, timeline, tmp_path, monkeypatch
):
    # A crowning stopped after recording its move and before writing champion: the round read "no
    # champion" and refused the model (or, mid-promotion, gated against the old champion and
    # learnt so only at its own promotion, after the whole round).
    import json

    from components.registry.moves import MOVE_TAG

    cfg, registry = first_round(timeline, tmp_path)
    train(cfg)
    registry.set_alias("tools", "champion", None)
    registry.client.set_registered_model_tag("tools", MOVE_TAG, json.dumps({"champion": [None, 1]}))

    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(job, "fit_method", reached)  # past the champion check: enough
    with pytest.raises(Reached):
        job.retrain(cfg, str(timeline["increment"]))
    assert registry.aliases("tools") == {"champion": 1}


def test_a_round_whose_splits_differ_from_the_champions_is_refused_before_training(
    ray_session, timeline, tmp_path, monkeypatch
):
    # Another seed carves another holdout (and splits the no-tool queries otherwise): it held
    # requests the champion had trained on, and the gate compared a memorised score with a
    # held-out one.
    cfg, _ = first_round(timeline, tmp_path)
    train(cfg)  # the champion, with the config's splits
    monkeypatch.setattr(job, "fit_method", disk_full)  # planted where training starts
    other = {**cfg, "splits": {**cfg["splits"], "seed": 1}}
    with pytest.raises(ConfigError, match=r"splits differ from the champion's \(v1\).*'seed': \(0, 1\)"):
        job.retrain(other, str(timeline["increment"]))
    # The same splits spelled out in full, defaults and all, are the same splits: on to training.
    same = {**cfg, "splits": split_settings(cfg["splits"])}
    with pytest.raises(OSError, match="No space left"):
        job.retrain(same, str(timeline["increment"]))


def test_a_version_serving_cannot_load_is_kept_not_promoted(ray_session, timeline, tmp_path, monkeypatch):
    # The gate scores the challenger in memory; serving loads the registered files. Registered
    # without its index, it would have become the champion every replica then fails to load.
    cfg, registry = first_round(timeline, tmp_path)
    real = job.register

    def register_then_lose_the_index(reg, *args, **kwargs):
        version = real(reg, *args, **kwargs)
        shutil.rmtree(os.path.join(reg.local_dir(version), "bm25s"))
        return version

    monkeypatch.setattr(job, "register", register_then_lose_the_index)
    record = job.retrain(cfg, str(timeline["increment"]))
    assert record["decision"] == "kept" and "champion" not in registry.aliases("tools")
    assert "does not load as serving loads it" in record["reasons"][-1]
    assert registry.version("tools", 1).tags["toolscout.decision"] == "kept"


def test_a_hand_promotion_just_before_the_rounds_own_is_not_overwritten(
    ray_session, timeline, tmp_path, monkeypatch
):
    # The round checked the champion, then moved the alias in a separate step: a hand promotion
    # in between was overwritten by a decision made against another champion. The check and the
    # move are one step under the alias lock now. (Here the hand move comes as the round loads
    # its registered version, after that check.)
    cfg, registry = first_round(timeline, tmp_path)
    real = job.serving_load_problem

    def hand_promotion_meanwhile(path, query):
        ours = registry.log_version("tools", path)  # an operator's own version of the model
        runner.invoke(
            app, ["registry", "promote", "tools", str(ours.number), f"registry.root={tmp_path / 'registry'}"]
        )
        return real(path, query)

    monkeypatch.setattr(job, "serving_load_problem", hand_promotion_meanwhile)
    record = job.retrain(cfg, str(timeline["increment"]))
    assert record["decision"] == "kept" and record["reasons"][-1] == job.MOVED
    assert registry.aliases("tools") == {"champion": 2, "challenger": 1}
    assert registry.version("tools", 1).tags["toolscout.decision"] == "kept"


def test_an_alias_lock_that_is_never_released_keeps_the_challenger(
    ray_session, timeline, tmp_path, monkeypatch
):
    # A move whose process died on another host leaves the alias lock for good: the round died
    # after registering its version (tagged "promoting", the next base never written).
    from components.registry import AliasLock

    cfg, registry = first_round(timeline, tmp_path)
    monkeypatch.setattr(AliasLock, "wait_s", 0.2)
    with AliasLock(registry.settings.alias_lock):
        record = job.retrain(cfg, str(timeline["increment"]))
    assert record["decision"] == "kept" and "the alias lock is held" in record["reasons"][-1]
    assert "champion" not in registry.aliases("tools")
    assert registry.version("tools", 1).tags["toolscout.decision"] == "kept"


def test_a_promotion_serving_does_not_follow_fails_the_run(ray_session, timeline, tmp_path):
    # The first round has no champion to beat, so BM25 (no training) is promoted; the Serve app it
    # is told to follow is not running on this Ray. The promotion stands, and the run exits 1: a
    # scheduled retrain that left serving on the old champion must not look like a success.
    registry_root, out = tmp_path / "registry", tmp_path / "r0"
    result = retrain_cli(
        timeline,
        registry_root,
        "--out",
        str(out),
        "registry.model_name=tools",
        "retrain.follow_serving=true",
        "retrain.serve_app=no-such-app",
        "retrain.gate.latency_budget_ms=1000",
    )
    assert result.exit_code == 1, result.output
    assert "serving did not follow" in " ".join(result.output.split())
    record = json.loads((out / "decision.json").read_text())
    assert record["decision"] == "promoted" and record["serving"]["followed"] is False
    # Why, in the record and on the console (no Serve on this Ray, or no such app: test order decides).
    assert record["serving"]["reason"].split(":")[0] in result.output
    registry = ModelRegistry(RegistrySettings(root=str(registry_root)))
    assert registry.aliases("tools")["champion"] == 1


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("level", 95, r"level: expected a number in \(0, 1\)"),
        ("samples", 0, "samples"),
        ("latency_queries", 0, "latency"),
        # Each of these raised a TypeError in decide or the bootstrap after the challenger trained.
        ("max_hallucination_rate", None, r"max_hallucination_rate: expected a number; got None"),
        ("latency_budget_ms", "50", r"latency_budget_ms: expected a number; got '50'"),
        ("min_new_tool_coverage", None, "min_new_tool_coverage: expected a number"),
        ("samples", 2000.5, r"samples: expected an integer; got 2000\.5"),
        ("level", "0.95", "level: expected a number"),
        ("seed", None, "seed: expected an integer"),
        ("seed", -1, r"seed: expected an integer >= 0"),  # numpy refused it in the bootstrap
        ("min_holdout_queries", 0, r"min_holdout_queries: expected an integer >= 1"),
        ("min_holdout_queries", 2.5, r"min_holdout_queries: expected an integer"),
        ("metric", "ndcg@03", "retrain.gate.metric"),  # accepted, then no score has that name
    ],
)
def test_gate_settings_are_checked_when_read_not_after_training(key, value, says):
    from workflows.retrain.gate import GateSettings

    with pytest.raises(ValueError, match=says):
        GateSettings.from_config({key: value})


@pytest.mark.parametrize("metric", ["ndcg@20", "ndcg@0", "ndgc@3", "ndcg"])
def test_a_gate_metric_the_gate_cannot_score_is_refused_when_read(metric):
    from workflows.retrain.gate import GateSettings

    assert GateSettings.from_config({"metric": "recall@10"}).metric == "recall@10"
    # ndcg@20 over the gate's top-10 ranking would score a truncated list without a word.
    with pytest.raises(ValueError, match=r"retrain.gate.metric: expected .* k in 1..10"):
        GateSettings.from_config({"metric": metric})


def test_new_training_queries_that_repeat_a_holdout_request_join_the_holdout():
    # The base already has a holdout (shipped, or grown by an earlier round). A logged request that
    # repeats one of its queries, trained on, would be a holdout query the challenger has seen.
    from components.data.types import Dataset
    from workflows.retrain.increment import Increment, merge

    base = Dataset(
        name="tools",
        corpus={"t1": {"title": "weather", "text": "weather"}, "t2": {"title": "maps", "text": "maps"}},
        queries={"qv": "Find weather in Paris", "q1": "route to Lyon"},
        qrels={"train": {"q1": {"t2": 1}}, "valid": {"qv": {"t1": 1}}},
    )
    increment = Increment(
        queries={"n1": "find   weather in paris!", "n2": "weather in Rome"},
        qrels={"train": {"n1": {"t1": 1}, "n2": {"t1": 1}}},
    )
    merged = merge(base, increment)
    assert merged.qrels["valid"] == {"qv": {"t1": 1}, "n1": {"t1": 1}}
    assert merged.qrels["train"] == {"q1": {"t2": 1}, "n2": {"t1": 1}}
    assert base.qrels["train"] == {"q1": {"t2": 1}}  # the base is unchanged


def test_an_increment_judging_a_base_query_is_told_why_and_repeated_no_tool_texts_count_once(
    ray_session, timeline, tmp_path
):
    from components.data.rejects import RejectLog
    from workflows.retrain.increment import read_increment

    base = load_dataset(str(timeline["base"]))
    inc_dir = tmp_path / "inc"
    shutil.copytree(timeline["increment"], inc_dir)
    old = sorted(base.qrels["train"])[0]
    with (inc_dir / "qrels" / "train.tsv").open("a") as f:
        f.write(f"{old}\t{next(iter(base.corpus))}\t1\n")
        f.write(f"new-q\t{next(iter(base.corpus))}\t1\n")
    # A new tool query asking what a base no-tool query asks: rejected, the base's label kept.
    with (inc_dir / "queries.jsonl").open("a") as f:
        f.write(json.dumps({"_id": "new-q", "text": base.neg_queries[0].upper() + "?"}) + "\n")
    new_line = len((inc_dir / "queries.jsonl").read_text().splitlines())
    (inc_dir / "tooldet").mkdir()
    # The last asks what a base tool query asks: rejected, not learnt as needing no tool.
    tool_query = base.queries[old]
    texts = [
        "tell me a joke about cats",
        "what is your name",
        "tell me a joke about cats",
        tool_query.upper(),
    ]
    (inc_dir / "tooldet" / "neg_queries.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts)
    )
    log = RejectLog()
    inc = read_increment(str(inc_dir), base, log)
    reasons = [r.reason for r in log.rejects if r.file == "qrels/train.tsv"]
    assert f"query-id {old!r} is a base query; an increment judges only its own new queries" in reasons
    assert inc.neg_queries == ["tell me a joke about cats", "what is your name"]
    neg_rejects = [(r.line, r.reason) for r in log.rejects if r.file == "tooldet/neg_queries.jsonl"]
    assert neg_rejects == [(4, f"the same request as query-id {old!r} in queries.jsonl, a tool query")]
    query_rejects = [
        (r.line, r.reason) for r in log.rejects if r.file == "queries.jsonl" and "new-q" in r.reason
    ]
    assert query_rejects == [
        (
            new_line,
            "query 'new-q' asks what a no-tool query of the base data asks (its judgements go with it)",
        )
    ]
    assert "new-q" not in inc.queries and all("new-q" not in split for split in inc.qrels.values())


class AlwaysNeedsATool:
    """A detecting method that says every request needs a tool (what the gate counts is the point)."""

    capabilities = frozenset({"detect"})
    detect_threshold = 0.5
    tool_ids = ("t",)

    def retrieve(self, queries, k):
        return {q: {"t": 1.0} for q in queries}

    def detect(self, queries):
        return {q: 0.9 for q in queries}


def test_the_gate_counts_as_needing_a_tool_only_queries_with_a_relevant_one():
    # As evaluation counts: a holdout query judged only irrelevant says nothing about needing a tool.
    # Before, it was a positive, so this model scored 2/3 (it is right on one of its two requests).
    from workflows.retrain.gate import GateSettings, measure

    holdout = {"q1": {"t": 1}, "q2": {"t": 0}}
    queries = {"q1": "weather in Paris", "q2": "what is the time"}
    m = measure(AlwaysNeedsATool(), holdout, queries, ["hello"], {"t"}, [], GateSettings.from_config({}))
    assert m.metrics["detect_accuracy"] == 0.5


class FreeDecoder:
    """A method that decodes freely: its answers hold only real tools, its beams name others too."""

    capabilities = frozenset({"generate", "free_decoding"})
    tool_ids = ("t",)

    def retrieve(self, queries, k):
        return {q: {"t": 1.0} for q in queries}  # the invented names were dropped

    def generate(self, queries, k, constrained):
        from components.generative.hallucination import Output

        assert constrained is False
        return [
            [
                Output([1], -0.1, "t"),
                Output([2], -0.5, None),
                Output([3], -0.9, "retired"),
                Output([], -1.2, None),  # ended at once: names nothing, not a hallucination
            ]
            for _ in queries
        ]


def test_the_gate_counts_the_beams_a_freely_decoding_method_dropped():
    # Its answers name only real tools, so the returned-ids check always read 0 and the guardrail
    # max_hallucination_rate passed a model whose beams were mostly invented.
    from components.methods import build
    from workflows.retrain.gate import GateSettings, measure

    m = measure(
        FreeDecoder(), {"q1": {"t": 1}}, {"q1": "weather"}, [], {"t"}, [], GateSettings.from_config({})
    )
    assert m.metrics["hallucination_rate"] == pytest.approx(2 / 4)  # None, and a tool not in the catalog
    # Declared by the setting: a ToolGen that decodes freely says so, a constrained one does not.
    assert "free_decoding" in build("toolgen", {"decoding": "unconstrained"}).capabilities
    assert "free_decoding" not in build("toolgen").capabilities


def test_a_first_round_kept_by_a_guardrail_does_not_say_it_was_promoted():
    from workflows.retrain.gate import GateSettings, Measurement, decide

    metrics = {"hallucination_rate": 0.5, "p50_ms": 1.0, "new_tool_coverage": 1.0, "ndcg@3": 0.5}
    decision = decide(None, Measurement(metrics, {}), GateSettings())
    assert decision.decision == "kept" and not any("is promoted" in r for r in decision.reasons)
    assert "no champion yet" in decision.reasons[0]


@pytest.mark.parametrize(("n", "promoted"), [(1, False), (2, False), (29, False), (30, True)])
def test_a_holdout_too_small_for_the_interval_promotes_nothing(n, promoted):
    # Over one query the bootstrap interval has zero width: a gain on it alone was promoted.
    from workflows.retrain.gate import GateSettings, Measurement, decide

    metrics = {"hallucination_rate": 0.0, "p50_ms": 1.0, "new_tool_coverage": 1.0, "ndcg@3": 0.5}
    champion = Measurement(metrics, {f"q{i}": 0.0 for i in range(n)})
    challenger = Measurement(metrics, {f"q{i}": 1.0 for i in range(n)})
    decision = decide(champion, challenger, GateSettings())
    assert decision.interval["low"] > 0  # the interval alone says better
    assert decision.decision == ("promoted" if promoted else "kept")
    assert any("fewer than min_holdout_queries (30)" in r for r in decision.reasons) is not promoted
    assert decide(champion, challenger, GateSettings(min_holdout_queries=n)).decision == "promoted"
