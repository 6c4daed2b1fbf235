"""benchmarks/refit.py's summary: per metric, each arm's mean over the seeds both arms ran, and the paired gain; and
where each recipe's runs are kept."""

from __future__ import annotations

from tests.benchmarks.conftest import load_benchmark


def record(refit: bool, seed: int, strict: float) -> dict:
    metrics = {"strict_acc@1": strict, "deployment_strict_acc@1": strict - 1, "acc@1": 50.0, "mrr": 60.0,
               "strict_mrr": 55.0 + (1 if refit else 0)}
    return {"refit": refit, "seed": seed, "evaluation": metrics}


def test_the_gain_is_paired_by_seed_and_unpaired_seeds_are_left_out():
    refit = load_benchmark("refit")
    records = [record(False, 1, 46.0), record(True, 1, 48.0), record(False, 2, 47.0), record(True, 2, 47.5),
               record(False, 3, 40.0)]  # seed 3 has no refit run: not compared
    summary = refit.summarise(records, [1, 2, 3])
    assert summary["seeds"] == [1, 2]
    assert summary["no_refit"]["strict_acc@1"] == {"mean": 46.5, "std": 0.71}
    assert summary["refit"]["strict_acc@1"] == {"mean": 47.75, "std": 0.35}
    assert summary["gain"]["strict_acc@1"] == {"mean": 1.25, "std": 1.06}
    assert summary["gain_per_seed_strict_acc@1"] == [2.0, 0.5]
    assert summary["gain"]["strict_mrr"] == {"mean": 1.0, "std": 0.0} and summary["gain"]["acc@1"]["mean"] == 0.0


def test_each_recipe_keeps_its_runs_apart_and_a_changed_recipe_runs_anew(monkeypatch):
    """The records of `tuned` before a change to its settings must not stand in for the new recipe's runs."""
    from pgt import recipes

    refit = load_benchmark("refit")
    now, dated = refit.records_folder("tuned"), refit.records_folder("tuned-2026-12-04")
    assert now.parent == dated.parent == refit.RECORDS and now.name.startswith("tuned-") and now != dated
    assert refit.records_folder("tuned") == now  # the same settings, the same folder
    monkeypatch.setitem(recipes.RECIPES, "tuned", {**recipes.RECIPES["tuned"], "lr": 1e-3})
    assert refit.records_folder("tuned") != now


def test_the_training_speed_target_is_one_network_s():
    """benchmarks/train.py judges accuracy on the target row (the ensemble) and speed on one network's row."""
    train = load_benchmark("train")

    def row(strict, speed):
        m = {"mean": strict, "std": 0.0}
        return {"strict": {"acc@1": m}, "deployment": {"strict": {"acc@1": m}}, "acc@1": {"mean": 60.0},
                "mrr": {"mean": 71.0}, "train_samples_per_second_median": speed}

    verdict = train.verdict({"pgt (ensemble)": row(48.5, 500.0), "pgt (tuned)": row(47.0, 2500.0)}, "pgt (ensemble)")
    assert verdict == {"strict_acc@1": True, "deployment_strict_acc@1": True, "acc@1": True, "mrr": True,
                       "training_samples_per_second": True}
    assert not train.verdict({"pgt (ensemble)": row(47.9, 500.0)}, "pgt (ensemble)")["strict_acc@1"]
