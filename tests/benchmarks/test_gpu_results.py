"""The committed GPU results keep the fixed form the README and docs read (issue: Ray Train and Ray Tune on a GPU):
each train_gpu.json configuration names its engine, epoch seconds, samples/s, strict and protocol metrics and
the machine (GPU, CUDA, torch, Ray); sweep_gpu.json its trials, wall seconds, GPUs and best validation strict."""

from __future__ import annotations

import json

import pytest

from tests.conftest import PROJECT_ROOT

RESULTS = PROJECT_ROOT / "benchmarks" / "results"


def test_every_gpu_configuration_is_in_the_fixed_form():
    configurations = json.loads((RESULTS / "train_gpu.json").read_text())["configurations"]
    assert {c["engine"] for c in configurations.values()} >= {"in-process", "ray-train"}
    for name, c in configurations.items():
        assert c["engine"] in name and c["epoch_s"] > 0 and c["samples_per_s"] > 0, name
        assert 0 < c["strict"]["acc@1"]["mean"] < c["protocol"]["acc@1"]["mean"] < 100, name
        assert c["machine"]["gpu"].startswith("NVIDIA") and c["machine"]["cuda"] and c["machine"]["torch"], name
    ray_train = [c for c in configurations.values() if c["engine"] == "ray-train"]
    assert all(c["machine"]["ray"] for c in ray_train)


def test_the_gpu_sweep_and_profile_say_what_they_measured():
    sweep = json.loads((RESULTS / "sweep_gpu.json").read_text())
    assert sweep["gpus"]["count"] == 1 and 0 < sweep["gpus"]["per_trial"] < 1  # trials shared the one GPU
    assert sweep["meets_target"] == (sweep["trials"] >= 32 and sweep["wall_s"] <= 600)
    assert sweep["trials_per_hour"] == pytest.approx(sweep["trials"] / sweep["wall_s"] * 3600, rel=1e-3)
    assert 0 < sweep["best_validation_strict_acc@1"] < 100 and sweep["machine"]["ray"]
    profile = json.loads((RESULTS / "profile_gpu.json").read_text())
    assert profile["device"] == "cuda" and profile["kernels_per_step"] == round(profile["kernels"] / profile["steps"], 1)
    assert 0 < profile["kernel_s"] < profile["loop_s"] and profile["device_busy_fraction"] < 1


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
