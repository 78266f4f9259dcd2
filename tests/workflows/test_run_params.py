"""``run.params`` may name the artifact of a method trained earlier in the same ``toolscout run``."""

from __future__ import annotations

import pytest

from workflows.run import resolve_artifacts


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
    ],
)
def test_run_refuses_overrides_it_would_ignore(override: str, says: str) -> None:
    from typer.testing import CliRunner

    from workflows.cli import app

    result = CliRunner().invoke(app, ["run", override])
    assert result.exit_code == 1 and says in " ".join(result.output.split())


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


def test_a_config_files_method_section_is_refused_while_run_methods_lists_the_methods(tmp_path) -> None:
    from typer.testing import CliRunner

    from workflows.cli import app

    config = tmp_path / "c.yaml"
    config.write_text("method: {name: toolweaver}\n")
    result = CliRunner().invoke(app, ["run", "-c", str(config)])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "('toolweaver') is not used while run.methods" in said
