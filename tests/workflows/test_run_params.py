"""``run.params`` may name the artifact of a method trained earlier in the same ``toolscout run``."""

from __future__ import annotations

import pytest

from workflows.run_checks import resolve_artifacts


def test_artifact_references_resolve_anywhere_in_the_params() -> None:
    params = {"semantic_init": "{artifact:dense}/model", "nested": [{"x": "{artifact:bm25}"}], "lr": 0.1}
    got = resolve_artifacts(params, {"dense": "/w/models/dense/v0003", "bm25": "/w/models/bm25/v0001"})
    assert got == {
        "semantic_init": "/w/models/dense/v0003/model",
        "nested": [{"x": "/w/models/bm25/v0001"}],
        "lr": 0.1,
    }
    assert params["semantic_init"] == "{artifact:dense}/model"  # the config is left as it was


def test_a_method_not_trained_before_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="'dense'"):
        resolve_artifacts({"semantic_init": "{artifact:dense}/model"}, {"bm25": "/w/models/bm25/v0001"})


def run_refused(monkeypatch, *args: str) -> tuple[int, str]:
    """``toolscout run ARGS``'s exit code and output (on one line), its checks only: a setting
    they let through must not start a run."""
    from typer.testing import CliRunner

    import workflows.run
    from workflows.cli import app

    def passed_the_checks(cfg):
        raise AssertionError(f"{args} passed toolscout run's checks")

    monkeypatch.setattr(workflows.run, "quickstart", passed_the_checks)
    result = CliRunner().invoke(app, ["run", *args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("method.params.epochs=1", "run.params.<method>.<param>"),
        ("method.name=dense", "is not used while run.methods"),
        ("train.storage_path=s3://bucket/train", "set run.workdir instead"),
        ("registry.root=/elsewhere", "set run.workdir instead"),
        ("run.params.desne.epochs=1", "run.params has ['desne'], which run.methods"),
        ("run.methods=[bm25,desne]", "run.methods: \"unknown method 'desne'"),
        ("run.methods=[bm25,masstool]", "names 'dense', which run.methods does not train before it"),
        ("run.work_dir=/tmp/x", "run: unknown key(s) ['work_dir']"),
        # A whole section, or a setting the run decides besides paths: also replaced before.
        ("registry={root: /x}", "registry.root is decided by the run"),
        ("registry.model_name=mine", "registry.model_name is decided by the run"),
        ("evaluate.artifact=/some/model", "evaluate.artifact is decided by the run"),
        # Shipped params of a method the run leaves out, given on the command line: never read.
        ("run.params.masstool.epochs=1|run.methods=[bm25]", "run.params has ['masstool']"),
        ("run.n_queries=abc", "run.n_queries: expected an integer >= 10, got 'abc'"),
        ("run.n_queries=null", "run.n_queries: expected an integer >= 10, got None"),
        ("run.n_neg=-1", "run.n_neg: expected an integer >= 0"),
        ("run.workdir=null", "run.workdir: expected a directory path, got None"),
        ("run.wording=odd", "run.wording: expected one of ['held_out', 'shared']"),
        ("evaluate.splits=[valid,3]", "evaluate.splits: expected a list of split names"),
        # The shipped masstool selects on detection too: with no no-tool queries it failed after
        # bm25 and dense had trained.
        ("run.n_neg=0", "run.n_neg=0 generates no no-tool queries, which masstool's select_metric 'joint'"),
    ],
)
def test_run_refuses_overrides_it_would_ignore(override: str, says: str, monkeypatch) -> None:
    code, said = run_refused(monkeypatch, *override.split("|"))
    assert code == 1 and says in said, said


def test_data_half_written_by_an_interrupted_run_is_generated_again(tmp_path, monkeypatch) -> None:
    import workflows.run as run_module

    def cfg(seed: int) -> dict:
        settings = {
            "workdir": str(tmp_path),
            "seed": seed,
            "n_queries": 100,
            "n_neg": 10,
            "wording": "held_out",
        }
        return {"run": settings, "data": {}}

    data = run_module.quickstart_data(cfg(0))
    marker = tmp_path / "data" / run_module.GENERATED_WITH
    assert marker.exists()

    def interrupted(out_dir, **settings):  # stopped part-way through writing the files
        (tmp_path / "data" / "queries.jsonl").write_text("")
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "generate_quickstart", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_module.quickstart_data(cfg(1))
    # The seed-0 marker must not vouch for the half-written files: a rerun with seed 0 regenerates.
    assert not marker.exists()
    monkeypatch.undo()
    assert run_module.quickstart_data(cfg(0)) == data
    assert (tmp_path / "data" / "queries.jsonl").read_text()


def test_a_config_files_method_section_is_refused_while_run_methods_lists_the_methods(
    tmp_path, monkeypatch
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("method: {name: toolweaver}\n")
    code, said = run_refused(monkeypatch, "-c", str(config))
    assert code == 1 and "('toolweaver') is not used while run.methods" in said


def test_a_config_file_cannot_move_what_the_run_places_under_its_workdir(tmp_path, monkeypatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("train: {storage_path: s3://bucket/train}\n")
    code, said = run_refused(monkeypatch, "-c", str(config))
    assert code == 1 and "train.storage_path is decided by the run" in said


def test_without_run_methods_the_config_method_section_runs_with_its_params() -> None:
    from components.config import apply_overrides
    from workflows.run_checks import check_overrides, method_params, run_methods, shipped_config

    overrides = ["run.methods=null", "method.name=dense", "method.params.epochs=1"]
    cfg = apply_overrides(shipped_config(), overrides)
    check_overrides(overrides, cfg)
    assert run_methods(cfg) == ["dense"]
    # The shipped run.params.dense, with the method section's own params over them.
    assert method_params(cfg, "dense") == {"epochs": 1, "batch_size": 64, "lr": 1.0e-3}
    listed = apply_overrides(shipped_config(), ["run.params.dense.epochs=2"])
    assert method_params(listed, "dense")["epochs"] == 2


def test_quickstart_data_without_no_tool_queries_writes_no_empty_file(tmp_path) -> None:
    from components.data import open_dataset
    from components.data.quickstart import generate_quickstart

    generate_quickstart(str(tmp_path), n_queries=100, n_neg=20, wording="held_out")
    assert (tmp_path / "tooldet" / "neg_queries.jsonl").exists()
    counts = generate_quickstart(str(tmp_path), n_queries=100, n_neg=0, wording="held_out")
    # The loader refuses an empty file; and the 20 no-tool queries of before must not linger.
    assert counts["neg_queries"] == 0 and not (tmp_path / "tooldet" / "neg_queries.jsonl").exists()
    assert sum(len(v) for v in open_dataset(str(tmp_path)).neg_split.values()) == 0


def test_a_given_data_path_is_checked_with_its_storage_options(tmp_path, monkeypatch) -> None:
    import workflows.run as run_module

    asked = []

    def exists(path, options=None):
        asked.append((path, options))
        return True

    monkeypatch.setattr(run_module.io, "exists", exists)
    options = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    cfg = {"run": {"workdir": str(tmp_path)}, "data": {"path": "s3://b/ds", "storage_options": options}}
    assert run_module.quickstart_data(cfg) == "s3://b/ds"
    assert asked == [("s3://b/ds/corpus.jsonl", options)]
