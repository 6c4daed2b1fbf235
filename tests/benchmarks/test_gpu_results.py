"""The committed GPU results keep the fixed form the README and docs read: each train_gpu.json configuration names
its engine, epoch seconds (and a Ray Train one its refit's), samples/s, strict and protocol metrics and the machine
(GPU, CUDA, torch, Ray); sweep_gpu.json its trials, wall seconds, seeds per trial, trials per hour and finalists;
the captured step's profile and the fused seeds' cost beside their baselines."""

from __future__ import annotations

import json

import pytest

from tests.conftest import PROJECT_ROOT

RESULTS = PROJECT_ROOT / "benchmarks" / "results"


def test_every_gpu_configuration_is_in_the_fixed_form():
    """Every configuration: engine, epoch seconds, samples/s, strict and protocol metrics, the machine; a Ray Train
    one also its refit's epoch (epoch_s is the selection run's median after the first). A run the harness cut before
    its test is listed apart (cut_runs) with its log, never as a configuration."""
    results = json.loads((RESULTS / "train_gpu.json").read_text())
    configurations = results["configurations"]
    assert {c["engine"] for c in configurations.values()} >= {"in-process", "ray-train"}
    for name, c in configurations.items():
        assert c["engine"] in name and c["epoch_s"] > 0 and c["samples_per_s"] > 0, name
        assert 0 < c["strict"]["acc@1"]["mean"] < c["protocol"]["acc@1"]["mean"] < 100, name
        assert c["machine"]["gpu"].startswith("NVIDIA") and c["machine"]["cuda"] and c["machine"]["torch"], name
    ray_train = [c for c in configurations.values() if c["engine"] == "ray-train"]
    assert all(c["machine"]["ray"] for c in ray_train)
    assert all(0 < c["epoch_s"] < c["first_epoch_s"] and c["refit_epoch_s"] > 0 for c in ray_train)
    for cut in results.get("cut_runs", []):
        assert cut["engine"] == "ray-train" and cut["epoch_s"] > 0 and (PROJECT_ROOT / cut["log"]).is_file()


def test_the_gpu_sweep_says_what_it_measured():
    """sweep_gpu.json's fixed keys: trials, wall_s (the whole sweep), seeds_per_trial, trials_per_hour (the search's),
    finalists; the trials shared the one GPU, and the targets' verdicts follow from the figures."""
    sweep = json.loads((RESULTS / "sweep_gpu.json").read_text())
    assert sweep["gpus"]["count"] == 1 and 0 < sweep["gpus"]["per_trial"] < 1  # trials shared the one GPU
    assert sweep["seeds_per_trial"] >= 1 and sweep["finalists"] == len(sweep["confirmation"]["finalists"]) >= 2
    assert 0 < sweep["search_wall_s"] < sweep["wall_s"]
    assert sweep["trials_per_hour"] == pytest.approx(sweep["trials"] / sweep["search_wall_s"] * 3600, rel=1e-3)
    target = sweep["target"]
    assert sweep["meets_target"] == {
        "trials_per_hour": sweep["trials_per_hour"] >= target["trials_per_hour"],
        "confirmed_sweep": sweep["trials"] >= target["trials"] and sweep["wall_s"] <= target["wall_s"]}
    assert "base" in {f["name"] for f in sweep["confirmation"]["finalists"]}
    assert sweep["confirmation"]["winner"] == sweep["confirmation"]["finalists"][0]["name"]
    assert 0 < sweep["final"]["test"]["strict"]["acc@1"] < sweep["final"]["test"]["acc@1"] < 100
    assert 0 < sweep["best_validation_strict_acc@1"] < 100 and sweep["machine"]["ray"]
    profile = json.loads((RESULTS / "profile_gpu.json").read_text())
    assert profile["device"] == "cuda" and profile["kernels_per_step"] == round(profile["kernels"] / profile["steps"], 1)
    assert 0 < profile["kernel_s"] < profile["loop_s"] and profile["device_busy_fraction"] < 1


def test_the_captured_step_replays_one_graph_a_step_on_the_eager_profiles_card():
    """profile_gpu_captured.json beside profile_gpu_h100_eager.json (one card): one CUDA graph launch per step, the
    loop several times faster than the eager one, and the GPU's own kernels most of what is left."""
    eager = json.loads((RESULTS / "profile_gpu_h100_eager.json").read_text())
    captured = json.loads((RESULTS / "profile_gpu_captured.json").read_text())
    assert captured["machine"]["gpu"] == eager["machine"]["gpu"]
    assert captured["options"]["capture_step"] and captured["cuda_graph_launches"] == captured["steps"] > 0
    assert captured["unprofiled_loop_s"] * 3 < eager["unprofiled_loop_s"]
    assert captured["kernel_s"] > 0.5 * captured["unprofiled_loop_s"]


def test_fused_seeds_record_their_cost_against_separate_runs():
    fused = json.loads((RESULTS / "fused_seeds_gpu.json").read_text())
    runs = {r["seeds"]: r for r in fused["runs"]}
    assert sorted(runs) == [1, 3, 5] and fused["machine"]["gpu"].startswith("NVIDIA")
    for k, r in runs.items():
        assert len(r["validation_strict_acc@1"]) == k
        assert r["cost_vs_separate"] == pytest.approx(r["loop_epoch_s"] / (k * runs[1]["loop_epoch_s"]), abs=2e-3)


def test_the_compiled_profile_ran_every_step_as_cuda_graphs():
    """profile_gpu_compiled.json: every profiled step compiled, two CUDA graph launches a step (forward, backward),
    fewer kernels per step than the eager profile, and the compiled forward timed beside the eager one."""
    eager = json.loads((RESULTS / "profile_gpu.json").read_text())
    compiled = json.loads((RESULTS / "profile_gpu_compiled.json").read_text())
    assert compiled["options"]["compile_model"] and compiled["compiled_steps"] == compiled["steps"] > 0
    assert compiled["cuda_graph_launches"] == 2 * compiled["steps"]
    assert compiled["kernels_per_step"] < eager["kernels_per_step"]
    assert compiled["machine"]["gpu"] == eager["machine"]["gpu"]  # compared on the same card
    assert set(compiled["compiled_forward_samples_per_s"]) <= set(compiled["forward_samples_per_s"])


def test_the_one_hot_lookup_beside_its_embedding_baseline_on_one_card():
    """profile_gpu_h200_captured.json beside profile_gpu_h200_captured_embedding.json (one card, one call): the small
    tables as one-hot products leave the embeddings' backward (its sort of the ids and serial adds) out of the
    step, and the step's kernels take less time."""
    embedding = json.loads((RESULTS / "profile_gpu_h200_captured_embedding.json").read_text())
    one_hot = json.loads((RESULTS / "profile_gpu_h200_captured.json").read_text())
    assert one_hot["machine"]["gpu"] == embedding["machine"]["gpu"] and one_hot["options"] == embedding["options"]
    assert (embedding["one_hot_rows"], one_hot["one_hot_rows"]) == (0, 256)

    def embedding_backward_ms(profile: dict, names: tuple[str, ...]) -> float:
        return sum(op["self_ms"] for op in profile["top_device_ops"] if any(name in op["op"] for name in names))

    sort_and_serial_adds = ("indexing_backward", "RadixSort")  # the small tables' backward
    assert embedding_backward_ms(embedding, sort_and_serial_adds) > 20
    assert embedding_backward_ms(one_hot, sort_and_serial_adds) == 0
    # what remains is the location table's (more rows than ONE_HOT_ROWS): a tenth of the tables' backward before
    assert embedding_backward_ms(one_hot, ("embedding_backward",)) < 0.1 * embedding_backward_ms(
        embedding, ("embedding_backward", *sort_and_serial_adds))
    assert one_hot["kernel_s"] < embedding["kernel_s"] and one_hot["unprofiled_loop_s"] < embedding["unprofiled_loop_s"]


def test_the_sweeps_slot_time_reconciles():
    """sweep_gpu.json's time_breakdown: the search's slot-seconds are the trials' training loops, the rest of their
    own time and the time outside any trial, and every trial and epoch is counted."""
    sweep = json.loads((RESULTS / "sweep_gpu.json").read_text())
    times = sweep["time_breakdown"]
    assert times["trials"] == sweep["trials"] and times["epochs"] >= sweep["trials"]
    assert times["slot_s"] == pytest.approx(sweep["concurrent"] * sweep["search_wall_s"], abs=0.1)
    after = times.get("after_last_report_s", 0.0)  # counted apart since; before, inside outside_trials_s
    assert times["train_loop_s"] + times["in_trial_other_s"] + after + times["outside_trials_s"] == pytest.approx(
        times["slot_s"], abs=0.4)
