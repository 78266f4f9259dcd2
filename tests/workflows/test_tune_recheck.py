"""The seed re-check of ``toolscout tune``: what it trains, how it selects, how it is configured."""

from __future__ import annotations

import pytest
from conftest import TINY_ENCODER

import workflows.tune.trainable as trainable
from components.config import ConfigError
from workflows.tune.recheck import candidates, recheck_runs, summarise
from workflows.tune.restore import fingerprint
from workflows.tune.settings import tune_settings
from workflows.tune.sweep import base_config

SPACE = {"method.params.epsilon": {"uniform": [0.3, 0.9]}}


def settings(**recheck):
    cfg = {"method": {"name": "masstool"}, "tune": {"space": SPACE, "recheck": recheck or None}}
    return tune_settings(cfg, "x")


def trial(tid, valid, status="completed"):
    return {"trial_id": tid, "params": {"method.params.epsilon": valid}, "valid": valid, "status": status}


def test_the_mean_over_seeds_selects_not_the_luckiest_single_score():
    trials = [trial("a", 0.962), trial("b", 0.961), trial("c", 0.958), trial("d", 0.990, "stopped")]
    top = candidates(trials, settings(top=2, seeds=2))
    assert [t["trial_id"] for t in top] == ["a", "b"]  # completed only, best first
    runs = recheck_runs(top, settings(top=2, seeds=2), seed=10)
    assert [(r["trial_id"], r["seed"]) for r in runs] == [("a", 11), ("a", 12), ("b", 11), ("b", 12)]
    # a's first score was its seed's luck; b holds its level.
    values = {("a", 11): 0.955, ("a", 12): 0.956, ("b", 11): 0.960, ("b", 12): 0.959}
    scored = [(r, values[r["trial_id"], r["seed"]]) for r in runs]
    rows = summarise(top, scored, "max", seed=10)
    assert [r["trial_id"] for r in rows] == ["b", "a"]
    assert rows[0]["valid_runs"] == [0.961, 0.960, 0.959] and rows[0]["seeds"] == [10, 11, 12]
    assert rows[0]["failed"] == 0 and rows[0]["valid_mean"] == pytest.approx(0.960)
    assert rows[1]["valid_mean"] == pytest.approx((0.962 + 0.955 + 0.956) / 3)
    # Minimising, the lowest mean wins.
    assert summarise(top, scored, "min", seed=10)[0]["trial_id"] == "a"


def test_a_candidate_whose_recheck_run_failed_ranks_last_and_all_failing_is_an_error():
    top = [trial("a", 0.962), trial("b", 0.950)]
    runs = recheck_runs(top, settings(top=2, seeds=2), seed=0)
    # a diverges on both other seeds: its mean over its one score would be the best of all.
    values = {("a", 1): None, ("a", 2): None, ("b", 1): 0.951, ("b", 2): 0.949}
    rows = summarise(top, [(r, values[r["trial_id"], r["seed"]]) for r in runs], "max", seed=0)
    assert [(r["trial_id"], r["failed"]) for r in rows] == [("b", 0), ("a", 2)]
    assert rows[1]["valid_runs"] == [0.962] and rows[1]["seeds"] == [0]
    with pytest.raises(RuntimeError, match="all 4 seed re-check runs failed"):
        summarise(top, [(r, None) for r in runs], "max", seed=0)


@pytest.mark.parametrize(
    "recheck, says",
    [
        ({"top": 3}, "top and seeds must both be set"),
        ({"top": 2, "seeds": -1}, r"tune\.recheck\.seeds: expected a whole number >= 0"),
        ({"top": 2.5, "seeds": 1}, r"tune\.recheck\.top: expected a whole number"),
        ({"top": 2, "seeds": 1, "runs": 3}, "expected {top: <trials>, seeds: <seeds each>}"),
    ],
)
def test_a_bad_recheck_section_is_refused_naming_the_key(recheck, says):
    with pytest.raises(ConfigError, match=says):
        settings(**recheck)


def test_a_recheck_of_a_swept_seed_is_refused():
    space = SPACE | {"train.seed": {"choice": [0, 1, 2]}}
    cfg = {"method": {"name": "masstool"}, "tune": {"space": space, "recheck": {"top": 2, "seeds": 1}}}
    with pytest.raises(ConfigError, match=r"train\.seed is swept"):
        tune_settings(cfg, "x")


def test_the_recheck_shapes_the_sweep_but_an_old_sweep_without_one_still_restores():
    plain, checked = settings(), settings(top=3, seeds=2)
    assert (plain.recheck_top, checked.recheck_top, checked.recheck_seeds) == (0, 3, 2)
    base = base_config({"method": {"name": "masstool"}, "tune": {"space": SPACE}}, plain)
    # A sweep that selected one trial must not be restored to select another (its test was read).
    assert fingerprint(plain, base) != fingerprint(checked, base)
    assert "recheck_top" not in fingerprint(plain, base)["tune"]  # as fingerprints had it before


class Stop(Exception):
    pass


def test_a_recheck_seeds_only_the_stages_the_trial_trains_itself(monkeypatch):
    # The shared stage (MassTool's semantic) is cached by its seed: re-seeded, every re-check run
    # would train it again (and run_trial refuses that). The trial's own stage takes the new seed.
    seen = []

    def fit(stage, dataset, run):
        seen.append((stage, run.seed, run.report_to_tune))
        return {"reused": 1.0}

    def stop(corpus):
        raise Stop

    def built(base, params):
        from components.methods import build

        method = build("masstool", {"encoder": TINY_ENCODER})
        monkeypatch.setattr(method, "fit", fit)
        monkeypatch.setattr(method, "index", stop)  # after the stages: nothing left to see
        return base, method

    class Context:
        def get_trial_id(self):
            return "t1"

    monkeypatch.setattr(trainable, "trial_method", built)
    monkeypatch.setattr(trainable.tune, "get_context", Context)
    base = {"train": {"seed": 4, "storage_path": "/tmp/unused"}}
    with pytest.raises(Stop):
        trainable.run_recheck(
            {"recheck": {"params": {}, "seed": 5}},
            base=base,
            dataset=type("Data", (), {"corpus": {}})(),
            experiment="x-recheck",
            shared_stages=("semantic",),
        )
    assert seen == [("semantic", 4, None), ("joint", 5, None)]
