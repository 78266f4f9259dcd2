"""``toolscout tune``: search spaces, a real sweep on Ray Tune + Ray Train, ASHA, restore, best YAML."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import ray
import yaml
from conftest import LOCAL_MODE, TINY_ENCODER
from ray import tune

from components.config import ConfigError, load_yaml, merge
from components.methods import build
from workflows.cli_config import build_config, packaged_config
from workflows.tune.settings import tune_settings
from workflows.tune.space import parse_space
from workflows.tune.sweep import (
    SweepInterrupted,
    base_config,
    check_space,
    most_epochs,
    searcher,
    tune_sweep,
)


def config(data: str, root: Path, method: dict, **tune_section) -> dict:
    return merge(
        packaged_config("default"),
        {
            "data": {"path": data},
            "method": method,
            "train": {
                "storage_path": str(root / "train"),
                "local_dir": str(root / "ckpt"),
            },
            "tune": {
                "storage_path": str(root / "tune"),
                "max_concurrent": 1,
                "search": "random",
                **tune_section,
            },
        },
    )


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"method.params.lr": {"uniformly": [0.1, 1]}}, "unknown distribution 'uniformly'"),
        ({"method.params.lr": {"uniform": [0.1]}}, "uniform takes 2 numbers"),
        ({"method.params.lr": {"uniform": [1.0, 0.1]}}, "lower < upper"),
        ({"method.params.lr": {"loguniform": [0.0, 0.1]}}, "positive lower bound"),
        ({"method.params.lr": {"choice": []}}, "non-empty list"),
        ({"method.params.lr": {"uniform": ["a", "b"]}}, "takes numbers"),
        ({"method.params.lr": 0.1}, "expected one distribution"),
        # Each failed inside Ray without the key, or sampled other values under Optuna than under
        # random search (which rounds to multiples of q; Optuna steps from the lower bound).
        ({"method.params.lr": {"quniform": [0.0, 1.0, 0.0]}}, "positive q"),
        ({"method.params.lr": {"qrandint": [1, 8, -2]}}, "positive q"),
        ({"method.params.lr": {"quniform": [0.05, 1.0, 0.1]}}, "multiples of q = 0.1, got 0.05"),
        ({"method.params.lr": {"qrandint": [2, 10, 3]}}, "multiples of q = 3, got 2"),
        ({"method.params.lr": {"qrandint": [1, 5, 1]}}, "use randint"),
    ],
)
def test_a_bad_distribution_is_refused_naming_its_key(entry, says):
    with pytest.raises(ConfigError, match=r"tune\.space\.method\.params\.lr") as e:
        parse_space(entry)
    assert says in str(e.value)


SWEEPS = sorted(p.name for p in (Path(__file__).parents[2] / "workflows" / "configs").glob("*_tune.yaml"))


@pytest.mark.parametrize("name", SWEEPS)
def test_every_shipped_sweep_builds_its_method_from_a_sample_of_its_space(name):
    # What `toolscout tune` checks before any trial: a misspelt key (a K or L the method does not
    # take, a bad range) in a shipped sweep fails here, not after an hour of trials.
    cfg = build_config(Path(__file__).parents[2] / "workflows" / "configs" / name, [])
    settings = tune_settings(cfg, name)
    base = base_config(cfg, settings)
    method = check_space(base, parse_space(settings.space), settings)
    assert method.name == base["method"]["name"]
    assert settings.metric.startswith("valid/")  # selection never reads test


def test_a_key_the_method_does_not_take_is_refused_before_any_trial(tmp_path):
    cfg = config(
        "unused",
        tmp_path,
        {"name": "dense", "params": {"encoder": TINY_ENCODER}},
        space={"method.params.learning_rate": {"uniform": [0.1, 0.2]}},
    )
    settings = tune_settings(cfg, "x")
    with pytest.raises(ConfigError, match="learning_rate"):
        check_space(base_config(cfg, settings), parse_space(settings.space), settings)
    cfg["tune"]["space"] = {"model.lr": {"uniform": [0.1, 0.2]}}
    with pytest.raises(ConfigError, match=r"tune.space.model.lr: sweep keys start with method\."):
        check_space(base_config(cfg, settings), parse_space(cfg["tune"]["space"]), settings)
    # The data is split once for all trials: a splits key would change nothing but the noise.
    cfg["tune"]["space"] = {"splits.valid_fraction": {"uniform": [0.1, 0.2]}}
    with pytest.raises(ConfigError, match=r"tune.space.splits.valid_fraction: sweep keys start with"):
        check_space(base_config(cfg, settings), parse_space(cfg["tune"]["space"]), settings)
    for bad, says in [
        ({"metric": "test/ndcg@3"}, "never test"),
        ({"search": "bayes"}, "tune.search"),
        ({"spaces": {}}, "unknown keys"),
        ({"space": None}, "tune.space is not set"),
        # Before any trial, not after the sweep has read test for its best trial.
        ({"baseline": "hand_picked"}, "tune.baseline: 'hand_picked' is not a bench.methods entry"),
        ({"entry": "nope"}, "tune.entry: 'nope' is not a bench.methods entry"),
    ]:
        with pytest.raises(ConfigError, match=says):
            tune_settings(merge(cfg, {"tune": bad}), "x")
    # Ray refuses ray.train's APIs in a Tune function: trials cannot train in local mode.
    with pytest.raises(ConfigError, match=r"train.num_workers: 0 .* cannot run inside Tune trials"):
        tune_settings(merge(cfg, {"train": {"num_workers": 0}}), "x")
    # Nor a swept 0, which passed (the check read the base config) and failed in its trials.
    for workers in ({"choice": [0, 1]}, {"grid_search": [1, 0]}, {"randint": [0, 3]}):
        space = {"tune": {"space": {"train.num_workers": workers}}}
        with pytest.raises(ConfigError, match=r"tune.space.train.num_workers: its values include 0"):
            tune_settings(merge(cfg, space), "x")
    tune_settings(merge(cfg, {"tune": {"space": {"train.num_workers": {"choice": [1, 2]}}}}), "x")


def test_quantized_spaces_sample_the_same_values_under_both_searches():
    from ray.tune.search.optuna import OptunaSearch

    for spec, values in [({"qrandint": [3, 12, 3]}, {3, 6, 9, 12}), ({"quniform": [0.0, 1.0, 0.25]}, None)]:
        domain = parse_space({"method.params.x": spec})["method.params.x"]
        drawn = {domain.sample() for _ in range(300)}
        optuna = OptunaSearch.convert_search_space({"x": domain})["x"]
        if values is not None:
            assert drawn == values and set(range(optuna.low, optuna.high + 1, optuna.step)) == values
        else:
            assert drawn <= {0.0, 0.25, 0.5, 0.75, 1.0} and (optuna.low, optuna.step) == (0.0, 0.25)


def test_what_the_sweep_cannot_run_is_refused_before_any_trial(tmp_path):
    dense = {"name": "dense", "params": {"encoder": TINY_ENCODER, "epochs": 3}}
    cfg = config(
        "unused", tmp_path, dense, space={"method.params.lr": {"randn": [0.01, 0.001]}}, search="optuna"
    )
    settings = tune_settings(cfg, "x")
    # Optuna has no sampler for randn: this failed once the trials started, after shared stages.
    with pytest.raises(ConfigError, match=r"tune.space.method.params.lr: Optuna cannot sample it"):
        check_space(base_config(cfg, settings), parse_space(settings.space), settings)
    # A file:// storage path is a local directory, not "<cwd>/file:/...".
    local = tune_settings(merge(cfg, {"tune": {"storage_path": f"file://{tmp_path}/sweeps"}}), "x")
    assert local.storage_path == f"{tmp_path}/sweeps"


def test_a_shared_stage_a_swept_key_changes_is_refused_before_any_training(tmp_path):
    # Before, the driver trained the shared stage, then the first trial trained it again (its
    # settings differed) and only then failed the sweep: two trainings lost.
    masstool = {
        "name": "masstool",
        "params": {"encoder": TINY_ENCODER, "semantic_cache": str(tmp_path / "c")},
    }
    space = {
        "method.params.epsilon": {"uniform": [0.3, 0.9]},  # the joint stage's: shared stage kept
        "method.params.semantic.lr": {"loguniform": [1e-4, 1e-2]},  # the semantic stage's own
        "train.seed": {"choice": [0, 1]},  # the cached stage is keyed by the seed too
    }

    def check(method: dict, space: dict, shared: list[str]) -> None:
        cfg = config("unused", tmp_path, method, space=space, shared_stages=shared)
        settings = tune_settings(cfg, "x")
        check_space(base_config(cfg, settings), parse_space(settings.space), settings)

    with pytest.raises(
        ConfigError, match=r"'semantic' .* \['method.params.semantic.lr', 'train.seed'\] change"
    ):
        check(masstool, space, ["semantic"])
    check(masstool, {"method.params.epsilon": space["method.params.epsilon"]}, ["semantic"])
    # The runner's settings shape the shared stage too, which trains once with the base value:
    # accepted, every trial reused a stage its best YAML would train otherwise.
    for key, values in (("train.precision", ["fp32", "bf16"]), ("train.grad_accumulation", [1, 2])):
        with pytest.raises(ConfigError, match=rf"sweeps \['{key}'\]; sweep them without shared stages"):
            check(masstool, {key: {"choice": values}}, ["semantic"])
    # Not cached: every trial would train it.
    uncached = {"name": "masstool", "params": {"encoder": TINY_ENCODER}}
    with pytest.raises(
        ConfigError, match=r"'semantic' stage is not cached \(set method.params.semantic_cache\)"
    ):
        check(uncached, {"method.params.epsilon": space["method.params.epsilon"]}, ["semantic"])
    with pytest.raises(ConfigError, match="dense caches no training stage"):
        check(
            {"name": "dense", "params": {"encoder": TINY_ENCODER}},
            {"method.params.lr": {"uniform": [0.1, 0.2]}},
            ["contrastive"],
        )


def test_asha_lets_the_longest_swept_epochs_finish():
    # ASHA stops every trial at max_t: taken from the base epochs alone, a swept 6-epoch trial
    # would be stopped before its last report and could never count as completed.
    built = build("dense", {"epochs": 3}).config()
    assert most_epochs(built, {"method.params.epochs": {"choice": [2, 6]}}) == 6
    assert most_epochs(built, {"method.params.epochs": {"randint": [1, 9]}}) == 9
    assert most_epochs(built, {"method.params.lr": {"uniform": [0.1, 0.2]}}) == 3
    # Epochs the config leaves at the method's default (dense: 8), and per-stage epochs (ToolGen):
    # before, both read as 1 epoch, so ASHA stopped every trial at its second report.
    assert most_epochs(build("dense", {}).config(), {}) == 8
    toolgen = build("toolgen", {}).config()
    assert most_epochs(toolgen, {}) == max(s["epochs"] for s in toolgen["stages"].values())
    assert most_epochs(toolgen, {"method.params.stages.agent.epochs": {"choice": [1, 30]}}) == 30


def test_a_random_search_samples_the_same_configs_for_the_same_seed(tmp_path):
    # Before, tune.seed reached Optuna only: search: random sampled other configs on every run.
    lr = {"method.params.lr": {"loguniform": [1e-4, 1e-2]}}
    space = parse_space(lr)
    cfg = config(str(tmp_path / "data"), tmp_path, {"name": "dense", "params": {}}, space=lr)

    def sampled(seed: int, concurrent: int = 3) -> list[float]:
        generator = searcher(tune_settings(merge(cfg, {"tune": {"seed": seed}}), "x"), concurrent)
        spec = {"run": lambda config: None, "config": space, "num_samples": 3, "storage_path": str(tmp_path)}
        generator.add_configurations({f"seed{seed}-{concurrent}": spec})
        trials = iter(generator.next_trial, None)
        return [trial.config["method.params.lr"] for trial in trials]

    assert len(sampled(1)) == 3 and sampled(1) == sampled(1) != sampled(2)
    # The generator holds the concurrency limit (Tune ignores max_concurrent_trials for a search
    # algorithm passed in): one trial at a time, the next once it finishes.
    assert sampled(1, concurrent=1) == sampled(1)[:1]


def cpus_free_again(before: float, timeout_s: float = 60.0) -> bool:
    """Whether Ray's free CPUs get back to ``before`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.fixture(scope="module")
def dense_sweep(ray_session, tmp_path_factory):
    """Two dense trials on Ray Train, one at a time, each worker holding both CPUs: a good one, then
    one planted to learn nothing (lr 1e-9), which ASHA stops at its first rung. A stopped trial's
    Ray Train controller dies without finishing, so its placement group is released by Ray Train's
    cleaner, not by the run: ``released`` says whether both CPUs came back after the sweep."""
    from components.data.quickstart import generate_quickstart

    root = tmp_path_factory.mktemp("tune")
    generate_quickstart(str(root / "data"), seed=3, n_queries=300, n_neg=20)
    method = {"name": "dense", "params": {"encoder": TINY_ENCODER, "epochs": 3, "batch_size": 32, "lr": 2e-3}}
    cfg = config(
        str(root / "data"),
        root,
        method,
        name="planted",
        num_samples=1,
        out=str(root / "out" / "planted.json"),
        space={"method.params.lr": {"grid_search": [3e-3, 1e-9]}},
        time_budget_s=600,
        # The one completed trial trained once more with seed 1 (the seed re-check).
        recheck={"top": 1, "seeds": 1},
    )
    cfg["train"]["resources_per_worker"] = {"CPU": 2}
    free_before = ray.available_resources().get("CPU", 0.0)
    # Ctrl+C as the re-check's trial starts: the same command then restores the finished sweep (no
    # trial of it run again) and the re-check, and finishes. A trial cut off there can take its Ray
    # Train controller down before the controller hands its workers' placement group to Ray
    # Train's cleaner, leaving both CPUs reserved; the interrupted sweep releases such groups
    # (workflows/tune/orphans.py, tested alone in test_tune_orphans.py). The window is a race, so
    # this is a guard that the release holds inside a full run, not the test of the release.
    import workflows.tune.recheck as recheck

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recheck, "TimeBudget", lambda: InterruptAtStart(str(root / "interrupted")))
        with pytest.raises(SweepInterrupted, match="and its seed re-check finished"):
            tune_sweep(cfg)
    # Checked before restoring: a restore that waits for reserved CPUs would hang, not fail.
    assert cpus_free_again(free_before), "the interrupted re-check left its CPUs reserved"
    swept = {p: p.read_text() for p in (root / "tune" / "planted").glob("*/result.json")}
    report = tune_sweep(cfg)
    rerun = [p for p, text in swept.items() if p.read_text() != text]
    assert len(swept) == 2 and not rerun
    return cfg, report, root, cpus_free_again(free_before)


def test_asha_stops_the_planted_bad_trial_and_the_good_one_finishes(dense_sweep):
    _, report, _, released = dense_sweep
    by_lr = {t["params"]["method.params.lr"]: t for t in report["trials"]}
    good, bad = by_lr[3e-3], by_lr[1e-9]
    assert good["status"] == "completed" and good["epochs_reported"] == 3
    assert bad["status"] == "stopped" and bad["epochs_reported"] < 3
    assert bad["valid"] < good["valid"]
    assert report["best"]["params"] == {"method.params.lr": 3e-3}
    # Without the cleaner (it needs the dashboard's State API, see workflows/ray_env.py) the stopped
    # trial's group would keep both CPUs reserved, and a next trial would wait for them forever.
    # The cleaner finds its cluster as "auto": with a second Ray running on the same machine it
    # stops with "Found multiple active Ray instances" and this fails (docs/tune.md).
    assert released


def test_sweep_writes_every_trial_a_table_plots_and_one_test_reading(dense_sweep):
    _, _, root, _ = dense_sweep
    out = root / "out"
    assert sorted(os.listdir(out)) == [
        "planted.json",
        "planted.md",
        "planted.png",
        "planted_best.yaml",
        "planted_trials.png",
    ]
    saved = json.loads((out / "planted.json").read_text())
    assert len(saved["trials"]) == 2 and all(
        {"params", "valid", "status", "seconds"} <= set(t) for t in saved["trials"]
    )
    assert [(r["method"], r["split"]) for r in saved["results"]] == [
        ("dense_tuned", "valid"),
        ("dense_tuned", "test"),
    ]
    # The best trial's whole-method valid score is what it was selected on.
    assert saved["results"][0]["metrics"]["ndcg@3"] == pytest.approx(saved["best"]["valid"])
    assert (
        "| planted" not in (out / "planted.md").read_text() and "stopped" in (out / "planted.md").read_text()
    )


def test_the_seed_recheck_trains_the_top_trial_again_with_another_seed(dense_sweep):
    _, report, root, _ = dense_sweep
    (checked,) = report["recheck"]
    (good,) = [t for t in report["trials"] if t["status"] == "completed"]
    assert checked["trial_id"] == good["trial_id"] == report["best"]["trial_id"]
    assert checked["seeds"] == [0, 1] and checked["failed"] == 0
    assert checked["valid_runs"][0] == good["valid"]
    # Training is deterministic (train.deterministic): an equal score would mean seed 1 was not
    # applied and the re-check measured nothing.
    assert checked["valid_runs"][1] != checked["valid_runs"][0]
    assert report["best"]["valid_mean"] == pytest.approx(sum(checked["valid_runs"]) / 2)
    assert (root / "tune" / "planted" / "recheck").is_dir()  # its own experiment, inside the sweep's
    assert "## Seed re-check" in (root / "out" / "planted.md").read_text()


def test_the_best_yaml_trains_unchanged_with_the_selected_setting(dense_sweep):
    from workflows.train import train

    _, _, root, _ = dense_sweep
    best = load_yaml(root / "out" / "planted_best.yaml")
    assert best["method"]["params"]["lr"] == 3e-3 and best["bench"]["run"] == ["dense_tuned"]
    assert best["bench"]["methods"]["dense_tuned"]["params"] == best["method"]["params"]
    # In Ray Train's local mode (see LOCAL_MODE in conftest.py): the sweep's trials ran on workers.
    # Its registry and checkpoints in this test's directory, not the repo's runs/.
    here = {
        "train": {**LOCAL_MODE, "local_dir": str(root / "local")},
        "registry": {"root": str(root / "registry")},
    }
    out = train(merge(merge(packaged_config("default"), best), here))
    saved = json.loads((Path(out["artifact"]) / "config.json").read_text())
    assert saved["lr"] == 3e-3 and out["version"] == 1 and out["artifact"].startswith(str(root))
    assert "&id" not in (root / "out" / "planted_best.yaml").read_text()  # plain YAML, no anchors


class InterruptAtStart(tune.Callback):
    """Ctrl+C as the ``nth`` trial starts (once: a marker file remembers it across the restore)."""

    def __init__(self, marker: str, nth: int = 1) -> None:
        self.marker, self.nth, self.started = marker, nth, 0

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started += 1
        if self.started == self.nth and not os.path.exists(self.marker):
            Path(self.marker).write_text(json.dumps(trial.trial_id))
            os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupted_sweep_restores_and_does_not_rerun_finished_trials(ray_session, tmp_path, monkeypatch):
    from components.data.quickstart import generate_quickstart

    data = tmp_path / "data"
    generate_quickstart(str(data), seed=3, n_queries=300, n_neg=20)
    cfg = config(
        str(data),
        tmp_path,
        {"name": "bm25", "params": {"profile": "default"}},
        name="bm",
        num_samples=1,
        out=str(tmp_path / "out" / "bm.json"),
        space={"method.params.k1": {"grid_search": [0.9, 1.2, 1.5]}},
    )
    # A placement group an earlier run left reserved would make this sweep wait forever: fail now.
    assert cpus_free_again(ray.cluster_resources()["CPU"]), "CPUs are still reserved by an earlier run"
    marker = str(tmp_path / "interrupted")
    # Ctrl+C while the last trial runs: fit's results count it as terminated, and the sweep was
    # selected and test read with that trial unrun (then run again by the next command).
    with pytest.raises(SweepInterrupted, match="stopped before its 3 trials finished"):
        tune_sweep(cfg, callbacks=[InterruptAtStart(marker, nth=3)])
    cut = json.loads(Path(marker).read_text())
    assert not (tmp_path / "out").exists()  # nothing selected from a partial sweep
    # Restored under an edited config, the old sweep ran and was then counted and written by the
    # new settings: refused, naming what differs, before any trial.
    edited = merge(
        cfg, {"tune": {"num_samples": 2, "space": {"method.params.k1": {"grid_search": [0.9, 2.0]}}}}
    )
    with pytest.raises(
        ConfigError, match=r"started with other settings \(tune.num_samples, tune.space differ\)"
    ):
        tune_sweep(edited)
    report = tune_sweep(cfg)
    assert [t["status"] for t in report["trials"]] == ["completed"] * 3
    assert sorted(t["params"]["method.params.k1"] for t in report["trials"]) == [0.9, 1.2, 1.5]
    kept = [t for t in report["trials"] if t["trial_id"] != cut]
    assert len(kept) == 2
    for t in kept:
        trial_dir = next((tmp_path / "tune" / "bm").glob(f"*{t['trial_id']}*"))
        assert len((trial_dir / "result.json").read_text().splitlines()) == 1  # reported once: not re-run
    (rerun,) = [t for t in report["trials"] if t["trial_id"] == cut]
    assert rerun["finished_at"] >= max(t["finished_at"] for t in kept)
    with pytest.raises(ConfigError, match=r"tune\.resume=true"):
        tune_sweep(merge(cfg, {"tune": {"resume": False}}))
    assert yaml.safe_load((tmp_path / "out" / "bm_best.yaml").read_text())["method"]["name"] == "bm25"

    # The same command once more: the finished sweep's report, and test is not read again.
    import workflows.tune.outputs as outputs

    def reads_test(*args, **kwargs):
        raise AssertionError("a finished sweep read test again")

    monkeypatch.setattr(outputs, "split_rows", reads_test)

    def restores(*args, **kwargs):
        # Restored, a finished sweep ran its failed trials again, then returned the old report.
        raise AssertionError("a finished sweep was restored and run again")

    monkeypatch.setattr(tune.Tuner, "restore", restores)
    first = json.loads((tmp_path / "out" / "bm.json").read_text())
    assert tune_sweep(cfg) == first
    # tune.out since written by another sweep of the config (`tune.name=wider`, the same out):
    # the finished sweep was restored, re-selected and read test again. Its own copy answers.
    (tmp_path / "out" / "bm.json").write_text(json.dumps({"trials": [{"trial_id": "wider_00000"}]}))
    assert tune_sweep(cfg) == first


def test_a_gpu_sweep_on_a_cluster_without_a_gpu_is_refused_before_any_trial(ray_session, tmp_path):
    if ray.cluster_resources().get("GPU", 0) >= 1:
        pytest.skip("this Ray cluster has a GPU")
    from components.data.quickstart import generate_quickstart

    generate_quickstart(str(tmp_path / "data"), seed=3, n_queries=60, n_neg=4)
    cfg = config(str(tmp_path / "data"), tmp_path, {"name": "bm25", "params": {}}, name="gpu", num_samples=1)
    cfg["tune"]["space"] = {"method.params.k1": {"choice": [1.2]}}
    cfg["train"]["use_gpu"] = True
    with pytest.raises(ConfigError, match=r"train\.use_gpu: the Ray cluster has no GPU"):
        tune_sweep(cfg)  # before: trials started and their Ray Train runs waited for a GPU forever
    assert not (tmp_path / "tune" / "gpu").exists()


def test_an_epoch_report_without_the_schedulers_metric_fails_its_trial_naming_the_choices():
    # Checked by hand end to end (dense, valid/recall@10): under ASHA the trial fails with this
    # message, and under FIFO, where epochs are not forwarded, the sweep completes; before, Tune's
    # strict check stopped the whole sweep under either scheduler.
    from components.training.tune_reports import check_epoch_report

    check_epoch_report("valid_ndcg@3", {"valid_ndcg@3": 0.5, "loss": 1.0})
    with pytest.raises(ValueError, match=r"valid/recall@10: this stage reports \['valid_ndcg@3'\]"):
        check_epoch_report("valid_recall@10", {"valid_ndcg@3": 0.5, "loss": 1.0})


def test_the_time_budget_interrupts_as_ctrl_c_does_once_per_command(monkeypatch):
    # Tune's own time_budget_s marked the searcher finished and the running trials terminated:
    # the restored sweep had nothing left to run, and "run the same command again" never ended.
    # The budget interrupts instead (the restorable path above), timed from each command's start.
    from workflows.tune import progress

    sent = []
    monkeypatch.setattr(progress.os, "kill", lambda pid, sig: sent.append(sig))
    budget = progress.TimeBudget()
    monkeypatch.setenv(progress.BUDGET_ENV, str(time.monotonic()))  # the command's deadline, passed
    budget.setup()
    budget.on_step_begin(0, [])
    budget.on_step_begin(1, [])
    assert sent == [signal.SIGINT]  # once
    # The seed re-check's own callback, set up after the sweep: the same deadline, not a new budget.
    recheck = progress.TimeBudget()
    recheck.setup()
    recheck.on_step_begin(0, [])
    assert sent == [signal.SIGINT] * 2
    monkeypatch.setenv(progress.BUDGET_ENV, "")  # the restoring command has no budget
    budget.setup()
    budget.on_step_begin(2, [])
    assert sent == [signal.SIGINT] * 2


def test_the_best_yaml_of_a_swept_bench_entry_holds_that_entrys_method_only():
    # Trials train the entry's method in place of the config's own method section; a setting only
    # that section has must not reach the YAML, or train/bench would train something untried.
    from workflows.tune.outputs import best_config
    from workflows.tune.sweep import base_config

    cfg = {
        "data": {"path": "d"},
        "method": {"name": "masstool", "params": {"epochs": 10}},
        "bench": {"methods": {"frozen": {"method": "masstool", "params": {"finetune_encoder": False}}}},
    }
    space = {"method.params.epsilon": {"uniform": [0.5, 0.9]}}
    settings = tune_settings({**cfg, "tune": {"entry": "frozen", "space": space}}, "x")
    base = base_config(cfg, settings)
    out = best_config(cfg, base, {"method.params.epsilon": 0.7}, "frozen_tuned")
    assert out["method"] == {"name": "masstool", "params": {"finetune_encoder": False, "epsilon": 0.7}}
    assert out["bench"]["methods"]["frozen_tuned"]["params"] == out["method"]["params"]


def test_a_trial_reports_the_joint_score_of_a_method_scored_on_detection():
    from workflows.tune.trainable import valid_report

    # tune.metric: valid/joint selects on both towers: (N@3 + detection accuracy) / 2.
    both = valid_report({"ndcg@3": 0.9, "recall@3": 0.8, "detect_accuracy": 0.7, "detect_auroc": 0.95})
    assert both["valid_joint"] == pytest.approx(0.8) and both["valid_ndcg@3"] == 0.9
    assert "valid_joint" not in valid_report({"ndcg@3": 0.9, "recall@3": 0.8})  # no detector
