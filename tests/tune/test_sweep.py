"""Ray Tune sweeps with real Ray and MLflow: 4 trials 2 at a time, trials of the tuned recipe as TorchTrainers of two
workers, and a time budget (resumption and a crashed trial: test_sweep_resume.py; a 2-node cluster:
test_sweep_cluster.py)."""

from __future__ import annotations

import json

import pytest

from tests.tune.commands import tune_cli

# on GeoLife where ../shared/data is, else synthetic (training_sequences); on the test process's shared Ray
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("on_shared_ray")]


def test_four_trials_two_at_once(training_sequences, tmp_path, mlflow_server):
    """4 trials two at once; then 2 finalists and the base recipe on 2 fresh seeds each (fused), the best mean
    winning; then the winner's recipe file trained as `pgt train --recipe-file` trains it, which is the model logged
    and registered."""
    out = tmp_path / "sweep"
    r = tune_cli("--data", training_sequences, "--out", out, "--trials", 4, "--epochs", 1, "--max-concurrent", 2,
                 "--grace-period", 1, "--finalists", 2, "--confirm-seeds", 2, "--tracking-uri", mlflow_server,
                 "--experiment", "sweep-test", "--register", "swept")
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads((out / "tune.json").read_text())
    rows = result["trials"]
    assert len(rows) == 4 and len({row["trial_id"] for row in rows}) == 4
    assert all(row["config"]["d_model"] % row["config"]["nhead"] == 0 for row in rows)
    finished = [row for row in rows if row["status"] == "finished"]
    # the best trial by the objective, strict validation Acc@1 by default
    assert result["objective"] == "strict_acc@1"
    assert finished and result["best_validation_score"] == max(row["best_validation_score"] for row in finished)
    assert all(row["best_validation_score"] == row["best_validation_strict_acc@1"] for row in finished)
    best = next(row for row in rows if row["trial_id"] == result["best_trial"])
    assert 0 < result["best_test"]["acc@1"] <= 100
    # the finalists: the base recipe always, and the best distinct finished trials, each on seeds 1 and 2
    confirmation = result["confirmation"]
    finalists = confirmation["finalists"]
    names = [f["name"] for f in finalists]
    assert "base" in names and 2 <= len(finalists) <= 3 and not confirmation["unfinished"]
    assert {f["trial_id"] for f in finalists if f["trial_id"]} <= {row["trial_id"] for row in finished}
    base = finalists[names.index("base")]
    assert (best["trial_id"] in {f["trial_id"] for f in finalists}) == (best["config"] != base["config"])
    for f in finalists:
        assert f["seeds"] == [1, 2] and len(f["validation_scores"]) == 2
        assert f["mean"] == pytest.approx(sum(f["validation_scores"]) / 2)
        run = json.loads((out / "finalists" / f["name"] / "seeds-1-2" / "metrics.json").read_text())
        assert run["fused_seeds"] == 2 and run["test"] is None  # evidence on validation; test is not read
    winner = max(finalists, key=lambda f: (f["mean"], f["name"] == "base"))
    assert confirmation["winner"] == winner["name"] and result["best_config"] == winner["config"]
    assert "finalists on 2 fresh seeds" in r.stdout
    # the final run is the winner's recipe file, trained as `pgt train --recipe-file best_recipe.yaml` would
    from pgt.config import TrainConfig, load_recipe_file

    final = json.loads((out / "final" / "metrics.json").read_text())
    recipe = load_recipe_file(out / "best_recipe.yaml")
    expected = TrainConfig.from_recipe(recipe, data_dir=final["config"]["data_dir"], out_dir=final["config"]["out_dir"],
                                       seed=0, threads=final["config"]["threads"]).to_dict()
    assert final["config"] == expected
    assert {k: final["config"][k] for k in winner["config"]} == winner["config"]
    assert result["best_checkpoint"] == str(out / "final" / "best.pt")
    assert result["best_test"]["strict"]["acc@1"] == pytest.approx(final["test"]["strict"]["acc@1"])
    # two trials ran at the same time: some pair's [start, last report] intervals overlap
    spans = sorted((row["started_at"], row["last_report_at"]) for row in rows)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    # reuse_actors (the default): the later trials ran in the processes of the earlier ones, not in new ones
    pids = {json.loads((out / "trials" / row["trial_id"] / "node.json").read_text())["pid"] for row in rows}
    assert len(pids) < 4
    assert "trials;" in r.stdout and "val strict@1" in r.stdout  # the printed table

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    parent = result["mlflow"]["run_id"]
    children = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    trial_runs = [c for c in children if c.info.run_name.startswith("trial-")]
    assert len(trial_runs) == 4 and {c.info.status for c in trial_runs} <= {"FINISHED", "KILLED"}
    assert sorted(c.info.run_name for c in children if not c.info.run_name.startswith("trial-")) == sorted(
        ["final", *(f"finalist-{n}-seeds-1-2" for n in names)])
    assert all(len(client.get_metric_history(c.info.run_id, "validation_acc_at_1")) >= 1 for c in children)
    assert all(len(client.get_metric_history(c.info.run_id, "validation_strict_acc_at_1")) >= 1 for c in children)
    assert client.get_run(parent).info.status == "FINISHED"
    assert {"trials.png", "tune.json"} <= {a.path for a in client.list_artifacts(parent)}
    assert client.get_run(parent).data.metrics["best_test_acc_at_1"] == pytest.approx(result["best_test"]["acc@1"])
    assert client.get_run(parent).data.metrics["best_test_strict_acc_at_1"] == pytest.approx(
        result["best_test"]["strict"]["acc@1"])
    champion = client.get_model_version_by_alias("swept", "champion")
    assert champion.version == "1" and champion.tags["champion_decision"] == "promoted"
    assert json.loads(champion.tags["pgt.evidence_seeds"]) == winner["seeds"] == [1, 2]
    assert json.loads(champion.tags["pgt.evidence_scores"]) == pytest.approx(winner["validation_strict_acc@1"], abs=1e-4)
    # the model is the final run's, logged to its own run (a child of the sweep's) and registered from there
    final_run = result["final"]["mlflow"]["run_id"]
    assert champion.run_id == final_run and champion.tags["sweep_run_id"] == parent
    assert result["mlflow"]["model_uri"] == result["final"]["mlflow"]["model_uri"]

    # `pgt train` of the winner's recipe file, with the final run's seed and threads, leaves the same record
    from tests.in_process import pgt_here
    from tests.records import run_record, version_record

    trained = pgt_here("train", "--data", training_sequences, "--out", tmp_path / "trained", "--recipe-file",
                       out / "best_recipe.yaml", "--seed", 0, "--threads", final["config"]["threads"],
                       "--tracking-uri", mlflow_server, "--experiment", "sweep-test", "--register", "trained")
    assert trained.returncode == 0, trained.stderr[-3000:]
    train_run = json.loads((tmp_path / "trained" / "metrics.json").read_text())["mlflow"]["run_id"]
    record = run_record(client, final_run)
    assert record["model"] is not None and "metrics.json" in record["artifacts"] and record["epochs"] >= 1
    assert any(path.startswith("plots/") for path in record["artifacts"]) and len(record["datasets"]) == 3
    assert run_record(client, train_run) == record
    assert version_record(client, "trained", "1") == version_record(client, "swept", "1")


def test_trials_of_the_tuned_recipe_run_a_torch_trainer_of_two_workers(training_sequences, tmp_path, mlflow_server):
    """`pgt tune --recipe tuned --workers-per-trial 2`: the trial fits a TorchTrainer inside itself (0.5 CPU for the
    trial, 0.5 per worker) and trains the tuned family: its logged params are the recipe's (visit relations, relation
    inputs, the extended vocabulary, the unseen simulation) with the searched settings drawn; the parent run names
    the recipe, and the winner is a recipe file that `pgt train --recipe-file` trains again. With --no-final the
    sweep ends there: no final run, no model logged, test not read."""
    from mlflow.tracking import MlflowClient

    out = tmp_path / "sweep"
    r = tune_cli("--data", training_sequences, "--out", out, "--trials", 1, "--epochs", 1, "--max-concurrent", 1,
                 "--grace-period", 1, "--workers-per-trial", 2, "--cpus-per-worker", 0.5, "--recipe", "tuned",
                 "--search", "random", "--finalists", 0, "--no-final", "--tracking-uri", mlflow_server,
                 "--experiment", "recipe-sweep")
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads((out / "tune.json").read_text())
    finished = [row for row in result["trials"] if row["status"] == "finished"]
    assert len(finished) == len(result["trials"]) == 1
    for row in finished:
        metrics = json.loads((out / "trials" / row["trial_id"] / "metrics.json").read_text())
        assert metrics["workers"] == 2 and all(h["replicas_in_sync"] for h in metrics["history"])
        assert (out / "trials" / row["trial_id"] / "ray" / "train").is_dir()  # the trial's own Ray Train run

    client = MlflowClient(mlflow_server)
    parent = client.get_run(result["mlflow"]["run_id"])
    assert parent.data.params["recipe_name"] == "tuned" and parent.data.params["recipe.visit_relations"] == "True"
    for row in result["trials"]:
        params = client.get_run(row["mlflow_run_id"]).data.params
        assert (params["visit_relations"], params["relation_inputs"], params["unseen_slots"], params["simulate_unseen"]) == (
            "True", "True", "True", "True")  # the recipe's, kept
        for name, value in row["config"].items():  # the searched settings, drawn around the recipe
            assert params[name] == str(value), name
    trial = client.get_run(result["trials"][0]["mlflow_run_id"])
    # its epoch reached MLflow from the listener in Ray Train's controller, once, as the trial's one epoch
    assert [m.step for m in client.get_metric_history(trial.info.run_id, "train_loss")] == [0]
    assert trial.info.status == "FINISHED"
    # the winner is a recipe file: `pgt train --recipe-file` of it trains the best trial's configuration
    from pgt.cli import train_config
    from tests.pgt.test_options import parse

    best = json.loads((out / "trials" / result["best_trial"] / "metrics.json").read_text())["config"]
    again = train_config(parse("train", "--data", best["data_dir"], "--out", best["out_dir"],
                               "--recipe-file", str(out / "best_recipe.yaml"), "--threads", str(best["threads"])))
    # a trial is scored on validation: it never refits or reads test; the winner refits as `tuned` does
    assert not best["refit"] and not best["evaluate_test"]
    assert again.to_dict() == {**best, "resume": again.resume, "refit": True, "evaluate_test": True}
    assert all(row["test"] is None for row in result["trials"])
    assert "best_recipe.yaml" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    # --no-final: the search's winner is its recipe file; nothing trained it again, and test was not read
    assert result["final"] is None and result["best_test"] is None and result["best_checkpoint"] is None
    assert not (out / "final").exists() and "model_uri" not in result["mlflow"]
    assert not any(key.startswith("best_test") for key in parent.data.metrics)
    assert "the winner's recipe trained" not in r.stdout
    # lineage: the sweep and its trial name their data, source and recipe; both sampled their machine
    parent = client.get_run(parent.info.run_id)
    for run in (parent, trial):
        contexts = sorted(i.tags[0].value for i in run.inputs.dataset_inputs)
        assert contexts == ["test", "training", "validation"], run.info.run_name
        assert run.data.tags["mlflow.source.name"] == "pgt tune" and run.data.tags["pgt.recipe"] == "tuned"
        assert any(key.startswith("system/cpu_utilization") for key in run.data.metrics), run.info.run_name
    digests = json.loads((out / "sweep.json").read_text())["tracking"]["split_digests"]  # hashed once, by the driver
    assert {i.dataset.digest for i in trial.inputs.dataset_inputs} == {d[:16] for d in digests.values()}


def test_a_time_budget_ends_the_sweep_with_the_trials_that_fit(training_sequences, tmp_path):
    """--time-budget-s: Tune stops starting and running trials when it is spent; the sweep ends normally with the
    trials that fit (far fewer than asked), the best finished one winning and written as a recipe."""
    out = tmp_path / "sweep"
    # one epoch a trial, one trial at a time, 60 s: the first trial's process start, imports and epoch take 10-25 s on
    # two cores the other test worker also loads (two trials at once within 40 s once finished neither)
    r = tune_cli("--data", training_sequences, "--out", out, "--trials", 200, "--epochs", 1, "--grace-period", 1,
                 "--max-concurrent", 1, "--search", "random", "--time-budget-s", 60, "--finalists", 0, "--no-final")
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads((out / "tune.json").read_text())
    assert result["time_budget_reached"] and 1 <= len(result["trials"]) < 200
    assert any(row["status"] == "finished" for row in result["trials"])
    assert {row["status"] for row in result["trials"]} <= {"finished", "stopped (ASHA or time budget)", "error"}
    assert (out / "best_recipe.yaml").is_file()
