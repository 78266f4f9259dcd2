"""The MLflow-backed registry: versions, aliases, promote / rollback, URI resolution, no pickle."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from components.registry import ModelRegistry, RegistrySettings, parse_model_uri, resolve


def saved(root, name: str, payload: str) -> str:
    """A minimal saved-method dir (what log_version accepts)."""
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"method": "bm25", "payload": payload}))
    (path / "index.npy").write_bytes(payload.encode())
    return str(path)


@pytest.fixture
def registry(tmp_path) -> ModelRegistry:
    return ModelRegistry(RegistrySettings(root=str(tmp_path / "reg")))


def test_versions_are_logged_runs_with_files_params_and_metrics(registry, tmp_path):
    v1 = registry.log_version(
        "m",
        saved(tmp_path, "a", "one"),
        params={"method": {"name": "bm25", "params": {"k1": 1.2}}},
        metrics={"valid/ndcg_at_3": 0.5},
    )
    v2 = registry.log_version("m", saved(tmp_path, "b", "two"))
    assert (v1.number, v2.number) == (1, 2)
    assert v1.metrics == {"valid/ndcg_at_3": 0.5}
    run = registry.client.get_run(v1.run_id)
    assert run.data.params["method.params.k1"] == "1.2" and run.info.status == "FINISHED"
    local = registry.local_dir(v1)
    assert local.endswith(os.path.join("versions", "m", "v1"))
    with open(os.path.join(local, "config.json")) as f:
        assert json.load(f)["payload"] == "one"
    # The files as saved, and nothing else (no pickled model, no MLmodel wrapper).
    assert sorted(os.listdir(local)) == ["config.json", "index.npy"]
    # The sqlite store and the artifacts live under root (the embedded default).
    assert os.path.exists(tmp_path / "reg" / "mlflow.db")


def test_promote_and_rollback_move_the_aliases(registry, tmp_path):
    for i in range(3):
        registry.log_version("m", saved(tmp_path, f"v{i}", str(i)))
    assert registry.promote("m", 1) is None
    registry.set_alias("m", "challenger", 2)
    old = registry.promote("m", 2)
    assert old is not None and old.number == 1
    assert registry.aliases("m") == {"champion": 2, "previous": 1}  # challenger cleared: it won
    assert registry.rollback("m").number == 1
    assert registry.aliases("m") == {"champion": 1, "previous": 2}
    assert registry.rollback("m").number == 2  # a second rollback undoes the first
    with pytest.raises(ValueError, match="unknown alias"):
        registry.set_alias("m", "staging", 1)


def test_rollback_without_previous_and_unknown_refs_fail_clearly(registry, tmp_path):
    registry.log_version("m", saved(tmp_path, "a", "x"))
    registry.promote("m", 1)
    with pytest.raises(LookupError, match="no 'previous'"):
        registry.rollback("m")
    with pytest.raises(LookupError, match="no alias 'challenger'"):
        registry.lookup("models:/m@challenger")
    with pytest.raises(LookupError):
        registry.lookup("models:/m/7")
    with pytest.raises(LookupError, match="no versions"):
        registry.lookup("models:/other/latest")
    with pytest.raises(ValueError, match="bad model URI"):
        parse_model_uri("models:/m/v1")
    with pytest.raises(ValueError, match=r"no config\.json"):
        registry.log_version("m", str(tmp_path))


def test_resolve_turns_uris_into_version_dirs_and_leaves_paths(registry, tmp_path):
    for i in range(2):
        registry.log_version("m", saved(tmp_path, f"v{i}", str(i)))
    registry.promote("m", 1)
    settings = registry.settings.as_config()
    assert resolve("models:/m@champion", settings).endswith("/m/v1")
    assert resolve("models:/m/latest", settings).endswith("/m/v2")
    assert resolve("models:/m/2", settings) == resolve("models:/m/latest", settings)
    assert resolve(str(tmp_path / "v0"), settings) == str(tmp_path / "v0")


def test_concurrent_resolves_materialise_one_dir(registry, tmp_path):
    version = registry.log_version("m", saved(tmp_path, "a", "x"))
    got: list[str] = []
    barrier = threading.Barrier(6)

    def take():
        barrier.wait()
        got.append(registry.local_dir(version))

    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every thread got the directory (one that raised would be missing here), complete.
    assert len(got) == 6 and len(set(got)) == 1
    assert os.path.exists(os.path.join(got[0], "config.json"))
    parent = os.path.dirname(got[0])
    assert sorted(os.listdir(parent)) == ["v1", "v1.source"]  # no temp links left behind


def test_two_registries_sharing_a_root_do_not_hand_out_each_other_s_version(tmp_path):
    # Each its own sqlite store, one root for local copies: both have a version 1 of "m".
    one, two = (
        ModelRegistry(
            RegistrySettings(
                root=str(tmp_path / "reg"),
                tracking_uri=f"sqlite:///{tmp_path}/{n}.db",
                artifact_root=str(tmp_path / n / "artifacts"),
            )
        )
        for n in ("one", "two")
    )
    first = one.log_version("m", saved(tmp_path, "a", "from-one"))
    second = two.log_version("m", saved(tmp_path, "b", "from-two"))
    local = one.local_dir(first)
    with open(os.path.join(local, "index.npy")) as f:
        assert f.read() == "from-one"
    with pytest.raises(ValueError, match=r"give each registry its own registry\.root"):
        two.local_dir(second)


def test_settings_prefer_explicit_uri_then_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    s = RegistrySettings(root=str(tmp_path))
    assert s.resolved_uri == f"sqlite:///{tmp_path}/mlflow.db" and s.embedded
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert s.resolved_uri == "http://mlflow:5000" and not s.embedded
    assert RegistrySettings(tracking_uri="sqlite:///x.db").resolved_uri == "sqlite:///x.db"


def test_a_hand_move_of_the_champion_does_not_wait_for_a_running_retrain(registry, tmp_path):
    # A round holds the retrain lock while it trains (tens of minutes): an operator's rollback
    # used to be refused for all that time. It goes through, and the round, which gated against
    # the champion it read at the start, then promotes nothing (tests/workflows/test_retrain.py).
    from typer.testing import CliRunner

    from components.registry import RetrainLock
    from workflows.cli import app
    from workflows.retrain.job import champion_moved

    for i in range(2):
        registry.log_version("m", saved(tmp_path, f"v{i}", str(i)))
    registry.promote("m", 1)
    started_with = registry.alias("m", "champion")
    root = f"registry.root={registry.settings.root}"
    with RetrainLock(str(tmp_path / "reg" / "retrain.lock")):
        result = CliRunner().invoke(app, ["registry", "promote", "m", "2", root])
        assert result.exit_code == 0, result.output
        assert champion_moved(registry, "m", started_with)
        assert CliRunner().invoke(app, ["registry", "rollback", "m", root]).exit_code == 0
    assert registry.aliases("m") == {"champion": 1, "previous": 2}
    assert registry.alias("m", "challenger") is None  # an alias that is not set reads as none


def test_alias_moves_take_turns_under_the_alias_lock(registry, tmp_path, monkeypatch):
    from components.registry import AliasLock, ChampionMoved, LockHeld

    for i in range(3):
        registry.log_version("m", saved(tmp_path, f"v{i}", str(i)))
    registry.promote("m", 1)
    lock = AliasLock(registry.settings.alias_lock)
    # Held by another move: a promotion waits for it, and past its wait it is refused by name,
    # with the aliases untouched.
    monkeypatch.setattr(AliasLock, "wait_s", 0.2)
    with lock, pytest.raises(LockHeld, match="another alias move holds"):
        registry.promote("m", 2)
    with lock, pytest.raises(LockHeld, match="another alias move holds"):
        registry.rollback("m")
    assert registry.aliases("m") == {"champion": 1}
    monkeypatch.setattr(AliasLock, "wait_s", 30.0)
    lock.acquire()
    threading.Timer(0.3, lock.release).start()
    registry.promote("m", 2)  # waits for the release
    assert registry.aliases("m") == {"champion": 2, "previous": 1}
    assert lock.holder() is None  # released after the move
    # Conditional on the champion a retrain gated against: refused once it moved, nothing changed.
    with pytest.raises(ChampionMoved, match="champion is v2, not v1"):
        registry.promote("m", 3, replacing=1)
    with pytest.raises(ChampionMoved, match="champion is v2, not vNone"):
        registry.promote("m", 3, replacing=None)
    assert registry.aliases("m") == {"champion": 2, "previous": 1}
    registry.promote("m", 3, replacing=2)
    assert registry.aliases("m") == {"champion": 3, "previous": 2}


@pytest.mark.parametrize(
    "splits",
    [
        None,
        {},
        {"seed": 3},
        {"mode": "cold_start", "neg_fractions": {"train": 0.7, "valid": 0.3}},
        # Read back as YAML 1.1: 1e-05 was the text "1e-05", "on" True and the date a date.
        {"valid_fraction": 1e-05, "tag": "on", "since": "2024-01-01", "name": "yes"},
    ],
)
def test_a_logged_config_section_reads_back_typed(registry, tmp_path, splits):
    # MLflow keeps params flat and as text: a retrain compares the champion's splits with its own.
    v = registry.log_version("m", saved(tmp_path, "v", "x"), params={"splits": splits, "method": {"k1": 1.2}})
    assert registry.params(v, "splits") == splits
    assert registry.params(v, "method") == {"k1": 1.2}
    with pytest.raises(LookupError, match="logged no 'data'"):
        registry.params(v, "data")


def test_new_stores_start_from_one_migrated_database_and_an_existing_one_is_never_replaced(tmp_path):
    from components.registry.sqlite_template import _template, create_from_template

    first = ModelRegistry(RegistrySettings(root=str(tmp_path / "a")))
    assert (tmp_path / "a" / "mlflow.db").read_bytes() == Path(_template()).read_bytes()
    first.client.create_registered_model("kept")
    # Another process that made the database first (or this one, earlier) keeps it as it is.
    create_from_template(str(tmp_path / "a" / "mlflow.db"))
    again = ModelRegistry(RegistrySettings(root=str(tmp_path / "a")))
    assert [m.name for m in again.client.search_registered_models()] == ["kept"]
    assert sorted(os.listdir(tmp_path / "a")) == ["mlflow.db"]  # no staged copy left behind
    # A store from the template is a working, empty MLflow store of its own.
    other = ModelRegistry(RegistrySettings(root=str(tmp_path / "b")))
    assert other.client.search_registered_models() == []


def test_a_champion_whose_run_was_garbage_collected_is_still_the_champion(registry, tmp_path):
    # `mlflow gc` removes a deleted run for good; the version, its files and aliases stay. Before,
    # reading the champion's run failed inside alias() and read as "no champion": a retrain then
    # promoted its challenger without a gate.
    import subprocess
    import sys

    first = registry.log_version("m", saved(tmp_path, "a", "one"), metrics={"valid/ndcg_at_3": 0.5})
    registry.promote("m", first.number)
    registry.client.delete_run(first.run_id)
    uri = registry.client.tracking_uri
    # In its own process: `mlflow gc` sets the process-wide tracking URI, which later tests would inherit.
    gc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlflow",
            "gc",
            "--backend-store-uri",
            uri,
            "--tracking-uri",
            uri,
            "--run-ids",
            first.run_id,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert gc.returncode == 0, gc.stderr
    champion = registry.alias("m", "champion")
    assert champion is not None and champion.number == 1 and champion.metrics == {}
    assert registry.lookup("models:/m@champion").number == 1
    assert registry.alias("m", "challenger") is None  # an alias that is not set is still None


def test_a_rollback_that_would_move_nothing_is_refused(registry, tmp_path):
    for name in ("a", "b"):
        registry.log_version("m", saved(tmp_path, name, name))
    registry.promote("m", 2)
    # What a promotion whose champion write failed after its previous write leaves behind.
    registry.set_alias("m", "previous", 2)
    with pytest.raises(LookupError, match="'previous' and 'champion' are both v2"):
        registry.rollback("m")


@pytest.mark.parametrize("stop_at", [1, 2])
def test_a_move_a_crash_left_half_done_is_finished_by_the_next_one(registry, tmp_path, monkeypatch, stop_at):
    # A driver killed between a promotion's two alias writes left champion and previous on one
    # version; rollback then refused, and the demoted version was in no alias at all.
    for i in range(3):
        registry.log_version("m", saved(tmp_path, f"v{i}", str(i)))
    registry.promote("m", 1)
    registry.promote("m", 2)
    real, writes = registry.set_alias, []

    def dies(name, alias, number):
        writes.append(alias)
        if len(writes) == stop_at:
            raise KeyboardInterrupt("driver stopped")
        real(name, alias, number)

    monkeypatch.setattr(registry, "set_alias", dies)
    with pytest.raises(KeyboardInterrupt):
        registry.promote("m", 3)
    monkeypatch.setattr(registry, "set_alias", real)
    assert registry.aliases("m") != {"champion": 3, "previous": 2}  # half done, as the crash left it
    # The next move finishes it first: here a rollback, which then undoes the promotion of v3.
    assert registry.rollback("m").number == 2
    assert registry.aliases("m") == {"champion": 2, "previous": 3}
    assert "toolscout.alias_move" not in (registry.client.get_registered_model("m").tags or {})


def test_finishing_a_stopped_move_keeps_an_alias_moved_since(registry, tmp_path, monkeypatch):
    # A retrain sets challenger without settling first: finishing the old move must not remove the
    # challenger it set after the crash (the record said challenger -> none).
    for i in range(3):
        registry.log_version("m", saved(tmp_path, f"v{i}", str(i)))
    registry.promote("m", 1)
    registry.set_alias("m", "challenger", 2)
    real, writes = registry.set_alias, []

    def dies(name, alias, number):
        writes.append(alias)
        if alias == "champion":
            raise KeyboardInterrupt("driver stopped")
        real(name, alias, number)

    monkeypatch.setattr(registry, "set_alias", dies)
    with pytest.raises(KeyboardInterrupt):
        registry.promote("m", 2)  # previous <- 1 written, then the driver dies
    monkeypatch.setattr(registry, "set_alias", real)
    registry.set_alias("m", "challenger", 3)  # the next round's challenger, set without the lock
    registry.rollback("m")  # finishes the promotion of v2 first, then rolls it back
    assert registry.aliases("m") == {"champion": 1, "previous": 2, "challenger": 3}


def test_two_first_trainings_at_once_crown_the_older_version(registry, tmp_path):
    # Each saw versions [1, 2] when it came to promote: neither crowned, and retrain refused the
    # model from then on. The oldest version is the first one.
    from workflows.train import crown

    for i in range(2):
        registry.log_version("m", saved(tmp_path, f"v{i}", str(i)))
    crown(registry, "m", 2)
    assert registry.aliases("m") == {}
    crown(registry, "m", 1)
    assert registry.aliases("m") == {"champion": 1}
    crown(registry, "m", 2)  # a later version waits for the gate
    assert registry.aliases("m") == {"champion": 1}


def test_a_retrain_names_its_challenger_under_the_alias_lock(registry, tmp_path, monkeypatch):
    # Set without the lock, a challenger named while a promotion moved the aliases was removed
    # with the old one, and the new version was in no alias.
    from components.registry import AliasLock

    for i in range(2):
        registry.log_version("m", saved(tmp_path, f"v{i}", str(i)))
    registry.promote("m", 1)
    lock = AliasLock(registry.settings.alias_lock)
    set_alias, held = registry.set_alias, []

    def recording(*args):  # who holds the alias lock while the alias is written
        held.append(lock.holder())
        set_alias(*args)

    monkeypatch.setattr(registry, "set_alias", recording)
    registry.name_challenger("m", 2)
    assert registry.aliases("m") == {"champion": 1, "challenger": 2}
    assert held[0] is not None and held[0]["pid"] == os.getpid()
    assert lock.holder() is None  # and released
    # A lock never released (its holder died on another host) cannot be moving aliases: past its
    # wait the challenger is named anyway, as before.
    monkeypatch.setattr(AliasLock, "wait_s", 0.2)
    with lock:
        registry.name_challenger("m", 1)
    assert registry.aliases("m") == {"champion": 1, "challenger": 1}


def test_a_model_another_process_created_after_the_lookup_is_used_not_an_error(
    registry, tmp_path, monkeypatch
):
    # Two first trainings of a model: both looked the name up, found nothing, and created it; the
    # second create raised RESOURCE_ALREADY_EXISTS after its training, and its model was lost.
    first = registry.log_version("m", saved(tmp_path, "a", "one"))
    found = registry.client.get_experiment_by_name
    looked: list[str] = []

    def not_yet(name):  # the lookup ran before the other process created it
        looked.append(name)
        return None if len(looked) == 1 else found(name)

    monkeypatch.setattr(registry.client, "get_experiment_by_name", not_yet)
    monkeypatch.setattr(registry.client, "search_registered_models", lambda *a, **k: [])
    second = registry.log_version("m", saved(tmp_path, "b", "two"))
    assert (first.number, second.number) == (1, 2) and len(looked) == 2
    assert (
        registry.client.get_run(second.run_id).info.experiment_id
        == registry.client.get_run(first.run_id).info.experiment_id
    )
