"""The toolscout command line: the quickstart end to end, and clear errors with exit code 1."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from components.registry import ModelRegistry, RegistrySettings
from workflows.cli import app

runner = CliRunner()


def test_run_quickstart_end_to_end(ray_session, tmp_path):
    work = tmp_path / "qs"
    # The README's main job with its stages in Ray Train's local mode (see LOCAL_MODE in
    # tests/conftest.py): three worker start-ups were most of this test's time on 2 cores; the same
    # loop on worker actors is tested in tests/training/test_runner.py.
    result = runner.invoke(
        app,
        [
            "run",
            f"run.workdir={work}",
            "train.num_workers=0",
            "run.n_queries=400",
            "run.n_neg=50",
            "run.params.dense.epochs=1",
            "run.params.masstool.epochs=1",
            "run.params.masstool.semantic.epochs=1",
            f"evaluate.output={tmp_path / 'all.json'}",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((work / "results.json").read_text())
    # evaluate.output holds the whole run's report (each method's evaluation overwrote it before).
    assert json.loads((tmp_path / "all.json").read_text()) == report
    assert {r["split"] for r in report["results"]} == {"valid", "test"}
    assert {r["method"] for r in report["results"]} == {"bm25", "dense", "masstool"}
    masstool = next(r for r in report["results"] if r["split"] == "test" and r["method"] == "masstool")
    # The detection tower is scored too (BM25 has none to score).
    assert {"detect_accuracy", "detect_f1", "detect_auroc"} <= set(masstool["metrics"])
    versions = work / "registry" / "versions"
    assert (versions / "quickstart-dense" / "v1" / "model" / "heads.safetensors").exists()
    test_row = next(r for r in report["results"] if r["split"] == "test" and r["method"] == "bm25")
    assert 0.0 < test_row["metrics"]["recall@3"] <= 1.0
    assert (work / "results.md").exists() and (work / "results.png").stat().st_size > 0
    assert (work / "prepared" / "manifest.json").exists()
    # Every method is a registered model; a first version is its champion.
    registry = ModelRegistry(RegistrySettings(root=str(work / "registry")))
    assert {m: registry.aliases(f"quickstart-{m}") for m in ("bm25", "dense", "masstool")} == {
        m: {"champion": 1} for m in ("bm25", "dense", "masstool")
    }
    assert (versions / "quickstart-bm25" / "v1" / "config.json").exists()

    # The prepared directory as data.path: nothing is preprocessed again. A split the data lacks
    # fails before any training, and the results of the run before are not left to pass for it.
    again = ["run", f"run.workdir={work}", f"data.path={work / 'prepared'}", "run.methods=[bm25]"]
    result = runner.invoke(app, [*again, "evaluate.splits=[valid,tset]"])
    assert result.exit_code == 1 and "['tset'] not in the data's splits" in " ".join(result.output.split())
    assert not (work / "results.json").exists() and not (work / "results.png").exists()
    result = runner.invoke(app, [*again, "evaluate.splits=[valid]"])
    assert result.exit_code == 0, result.output
    rows = json.loads((work / "results.json").read_text())["results"]
    assert [(r["method"], r["split"]) for r in rows] == [("bm25", "valid")]
    # The same metrics as the run's own valid row, the timing beside them in both.
    assert rows[0]["metrics"] == next(r for r in report["results"] if r["split"] == "valid")["metrics"]
    assert rows[0]["eval_seconds"] > 0 and "eval_seconds" not in rows[0]["metrics"]


def test_a_run_that_fails_part_way_keeps_the_results_of_the_methods_done(ray_session, tmp_path, monkeypatch):
    import workflows.run

    trained = workflows.run.train

    def train(cfg, promote=False):
        if cfg["method"]["name"] == "dense":
            raise RuntimeError("dense failed")
        return trained(cfg, promote=promote)

    monkeypatch.setattr(workflows.run, "train", train)
    work = tmp_path / "qs"
    # An earlier run's evaluate.output must not outlive this failed one (it was written at the end only).
    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"results": []}')
    args = ["run", f"run.workdir={work}", "run.n_queries=200", "run.n_neg=20", "run.methods=[bm25,dense]"]
    result = runner.invoke(app, [*args, f"evaluate.output={earlier}"])
    assert result.exit_code == 1 and "dense failed" in str(result.exception)
    rows = json.loads((work / "results.json").read_text())["results"]
    assert {(r["method"], r["split"]) for r in rows} == {("bm25", "valid"), ("bm25", "test")}
    assert not earlier.exists()
    # A directory there is refused, not deleted with what it holds.
    (tmp_path / "reports" / "keep.json").parent.mkdir()
    (tmp_path / "reports" / "keep.json").write_text("{}")
    result = runner.invoke(app, [*args, "run.methods=[bm25]", f"evaluate.output={tmp_path / 'reports'}"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "is a directory; name the report's file" in said, said
    assert (tmp_path / "reports" / "keep.json").exists()


def test_bench_writes_json_table_and_plot(ray_session, tiny_dataset, tmp_path):
    out = tmp_path / "bench" / "r.json"
    result = runner.invoke(
        app, ["bench", "--data", str(tiny_dataset), "--methods", "bm25,bm25_lucene", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    methods = {(r["method"], r["split"]) for r in report["results"]}
    assert {("bm25", "valid"), ("bm25", "test"), ("bm25_lucene", "test")} <= methods
    row = report["results"][0]
    assert {"recall@3", "ndcg@3", "comp@3"} <= set(row["metrics"]) and "train_seconds" in row
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").exists()


def test_train_then_evaluate(ray_session, tiny_dataset, tmp_path, monkeypatch):
    reg = f"registry.root={tmp_path / 'reg'}"
    for _ in range(2):
        result = runner.invoke(app, ["train", "--data", str(tiny_dataset), reg])
        assert result.exit_code == 0, result.output
    assert "registered models:/tiny-bm25/2" in " ".join(result.output.split())
    # No --artifact: the newest version of <dataset>-<method>.
    result = runner.invoke(app, ["evaluate", "--data", str(tiny_dataset), "--split", "test", reg])
    assert result.exit_code == 0, result.output
    assert "| bm25 | test |" in result.output
    out = tmp_path / "reports" / "eval.json"
    args = [
        "evaluate",
        "--data",
        str(tiny_dataset),
        "--artifact",
        "models:/tiny-bm25@champion",
        f"evaluate.output={out}",
        reg,
    ]
    assert runner.invoke(app, args).exit_code == 0
    report = json.loads(out.read_text())
    assert report["results"][0]["split"] == "valid"  # valid unless asked for test
    # Valid carved with another fraction (or seed) is partly the version's training queries: refused.
    downloads = []
    real_local_dir = ModelRegistry.local_dir
    monkeypatch.setattr(
        ModelRegistry, "local_dir", lambda self, v: downloads.append(v.number) or real_local_dir(self, v)
    )
    result = runner.invoke(app, [*args[:5], "splits.valid_fraction=0.5", reg])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "was trained with other splits" in said, said
    assert "'valid_fraction': (0.1, 0.5)" in said
    assert downloads == []  # refused before the version is downloaded
    assert runner.invoke(app, args).exit_code == 0 and len(downloads) == 1  # the champion, once
    # A split the data does not have, on a real artifact: the error names it and what there is.
    args = ["evaluate", "--data", str(tiny_dataset), "--split", "nope", "--artifact", "models:/tiny-bm25/1"]
    result = runner.invoke(app, [*args, reg])
    said = " ".join(result.output.split())  # the console wraps long lines
    assert result.exit_code == 1 and "has no split 'nope'; it has ['test', 'train', 'valid']" in said
    args = ["evaluate", "--data", str(tiny_dataset), "--artifact", "models:/tiny-bm25@previous", reg]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "has no alias 'previous'" in " ".join(result.output.split())
    result = runner.invoke(app, ["registry", "list", "tiny-bm25", reg])
    rows = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [(r["version"], r["aliases"]) for r in rows] == [(1, ["champion"]), (2, [])]


def test_missing_data_is_a_clear_error():
    result = runner.invoke(app, ["preprocess"])
    assert result.exit_code == 1
    assert "data.path is not set: pass --data" in result.output


def test_bad_override_and_bad_config(tmp_path):
    result = runner.invoke(app, ["preprocess", "--data", "x", "novalue"])
    assert result.exit_code == 1 and "expected key=value" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    result = runner.invoke(app, ["preprocess", "--config", str(bad)])
    assert result.exit_code == 1 and "bad.yaml" in result.output and "invalid YAML" in result.output


def test_unknown_method_is_a_clear_error(tiny_dataset, tmp_path, monkeypatch):
    def no_ray(cfg):
        raise AssertionError("Ray started before the method name was checked")

    monkeypatch.setattr("workflows.cli.start_ray", no_ray)
    result = runner.invoke(
        app, ["train", "--data", str(tiny_dataset), "--method", "nope", f"registry.root={tmp_path}"]
    )
    assert result.exit_code == 1 and "unknown method 'nope'" in result.output


def test_run_on_a_mistyped_data_path_fails_instead_of_generating_data(tmp_path):
    missing = tmp_path / "tolllens"
    result = runner.invoke(app, ["run", f"run.workdir={tmp_path / 'w'}", f"data.path={missing}"])
    assert result.exit_code == 1
    assert "has no corpus.jsonl" in " ".join(result.output.split()) and not missing.exists()


def test_a_key_error_names_its_type(tiny_dataset, tmp_path, monkeypatch):
    import workflows.evaluate

    def broken(cfg):
        raise KeyError("train")

    monkeypatch.setattr(workflows.evaluate, "evaluate", broken)
    args = ["evaluate", "--data", str(tiny_dataset), "--artifact", "x", "--split", "test"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "KeyError: 'train'" in result.output
    assert "TOOLSCOUT_DEBUG" in result.output
    monkeypatch.setenv("TOOLSCOUT_DEBUG", "1")
    result = runner.invoke(app, args)
    assert isinstance(result.exception, KeyError)  # the traceback is let through


def test_a_config_value_of_the_wrong_shape_is_one_line_not_a_traceback(tiny_dataset, tmp_path):
    # null where a number goes raised a TypeError deep in the splits code: a 79-line traceback.
    args = ["evaluate", "--data", str(tiny_dataset), "--artifact", str(tmp_path / "x"), "splits.seed=null"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "error:" in result.output and "TOOLSCOUT_DEBUG" in result.output
    # No split at all printed an empty table and exited 0.
    result = runner.invoke(app, [*args[:-1], "evaluate.splits=[]"])
    assert result.exit_code == 1 and "evaluate.splits is empty" in result.output


def test_every_method_builds_from_the_default_config():
    from components import methods
    from workflows.cli_config import build_config

    for name in ("bm25", "dense", "masstool", "toolgen"):
        cfg = build_config(None, [], method__name=name)
        assert methods.build(cfg["method"]["name"], cfg["method"]["params"]).name == name
    cfg = build_config(None, ["method.params.profile=default"], method__name="dense")
    with pytest.raises(ValueError, match=r"method 'dense': bad method\.params"):
        methods.build(cfg["method"]["name"], cfg["method"]["params"])


@pytest.mark.parametrize("manifest", ["rayjob_bench.yaml", "rayjob_tune.yaml"])
def test_every_rayjob_entrypoint_builds_its_config(manifest):
    """The KubeRay manifests' commands name configs that exist and overrides that parse; a tune
    job's space builds its method (what the job would check first on the cluster)."""
    import shlex
    from pathlib import Path

    import yaml

    from components.methods import build
    from workflows.cli_config import build_config

    root = Path(__file__).resolve().parents[2]
    spec = yaml.safe_load((root / "deploy" / manifest).read_text())["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[0] == "toolscout" and argv[2] == "-c", argv
    cfg = build_config(root / argv[3], argv[4:])
    assert str(cfg["data"]["path"]).startswith("s3://")
    if argv[1] == "tune":
        from workflows.tune.settings import tune_settings
        from workflows.tune.space import parse_space

        settings = tune_settings(cfg, "x")
        assert settings.storage_path.startswith("s3://") and str(settings.out).startswith("s3://")
        assert parse_space(settings.space)
        entry = cfg["bench"]["methods"][settings.entry]
        build(entry.get("method", settings.entry), entry["params"])


def test_a_promoting_train_makes_each_new_version_the_champion(ray_session, tiny_dataset, tmp_path):
    # The quickstart trains with promote=True: a rerun's models, the ones its table reports, are
    # what `toolscout serve --model models:/quickstart-<method>@champion` serves. `toolscout
    # train` leaves a later version to the gate (test_train_then_evaluate: v1 stays champion).
    from components.config import load_config
    from components.registry import ModelRegistry, RegistrySettings
    from workflows.train import train

    cfg = load_config(
        None, [f"data.path={tiny_dataset}", f"registry.root={tmp_path / 'reg'}", "method.name=bm25"]
    )
    first, second = train(cfg, promote=True), train(cfg, promote=True)
    registry = ModelRegistry(RegistrySettings(root=str(tmp_path / "reg")))
    assert (first["version"], second["version"]) == (1, 2)
    assert registry.aliases(second["model"]) == {"champion": 2, "previous": 1}


def test_train_crowns_a_first_version_only(ray_session, tiny_dataset, tmp_path):
    # A model with versions but no champion (its alias removed) got whatever trained next crowned,
    # ungated; retrain refuses that state, and train now leaves it so.
    from components.config import load_config
    from components.registry import ModelRegistry, RegistrySettings
    from workflows.train import train

    cfg = load_config(
        None, [f"data.path={tiny_dataset}", f"registry.root={tmp_path / 'reg'}", "method.name=bm25"]
    )
    first = train(cfg)
    registry = ModelRegistry(RegistrySettings(root=str(tmp_path / "reg")))
    assert registry.aliases(first["model"]) == {"champion": 1}
    registry.set_alias(first["model"], "champion", None)
    second = train(cfg)
    assert second["version"] == 2 and registry.aliases(first["model"]) == {}
    with pytest.raises(LookupError, match=r"models:/.*/9"):
        registry.promote(first["model"], 9)


def test_registry_commands_where_there_is_no_registry_say_so(tmp_path, monkeypatch):
    # Run in another directory, `registry list` created an empty store there and said "no versions".
    monkeypatch.chdir(tmp_path)
    for args in (["list", "m"], ["promote", "m", "1"], ["rollback", "m"]):
        result = runner.invoke(app, ["registry", *args])
        said = " ".join(result.output.split())
        assert result.exit_code == 1 and "no registry at" in said and "registry.root" in said, said
    assert not (tmp_path / "runs").exists()
