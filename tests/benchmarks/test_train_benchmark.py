"""benchmarks/train.py: its GPU mode's input checks, the CPU figures it sets beside the GPU's, and the README's accuracy table
held to its results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.benchmarks.conftest import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "train.py"


def load_script():
    return load_benchmark("train")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_data_dir_without_a_manifest_is_refused_in_one_line(tmp_path):
    done = run("--gpu", "--variants", "published", "--data-dir", str(tmp_path))
    assert done.returncode != 0
    assert done.stderr.strip() == (f"error: {tmp_path / 'manifest.json'}: no such file; expected the output of "
                                   "`pgt preprocess` (train/validation/test.parquet and manifest.json)")


def test_data_dir_needs_exactly_one_variant(tmp_path):
    done = run("--variants", "default", "published", "--data-dir", str(tmp_path))
    assert done.returncode != 0
    assert "name that one in --variants" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_gpu_mode_without_cuda_says_so(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    done = run("--gpu", "--variants", "published", "--data-dir", str(tmp_path))
    assert done.returncode != 0
    assert done.stderr.strip() == "error: --gpu: torch sees no CUDA device on this machine"


def test_cpu_figures_beside_the_gpu_rows(tmp_path):
    """Epoch seconds come from the per-epoch samples/s (every epoch sees the whole train split): with 1,000
    train samples and epochs at 500, 400 and 250 samples/s, the epochs took 2.0, 2.5 and 4.0 s, median 2.5."""
    module = load_script()
    stat = {"mean": 40.0, "std": 1.0}
    summary = {"pgt (tuned)": {"runs": 1, "strict": {"acc@1": stat}, "acc@1": stat, "mrr": stat,
                               "validation": {"strict_acc@1": stat}, "train_samples_per_second_median": 400.0,
                               "test_forward_samples_per_second": 9000.0, "epochs_run": 3.0, "best_epoch": 1.0}}
    cpu = {"machine": {"cores": 2}, "when": "then",
           "variants": {"published": {"data": {"counts": {"samples": {"train": 1000}}}, "summary": summary,
                                      "runs": [{"model": "pgt (tuned)",
                                                "train_samples_per_second_epochs": [500.0, 400.0, 250.0]}]}}}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cpu))
    beside = module.cpu_beside({"pgt (tuned)": {}, "pgt": {}}, path, "published")
    assert list(beside) == ["pgt (tuned)"]  # a model the CPU file lacks gets no row
    assert beside["pgt (tuned)"]["epoch_seconds_median"] == 2.5
    assert beside["pgt (tuned)"]["train_samples_per_second_median"] == 400.0
    assert module.cpu_beside(summary, path, "default") == {}
    assert module.cpu_beside(summary, tmp_path / "absent.json", "published") == {}


def test_a_metric_without_a_spread_prints_its_mean_alone():
    """An entry written from one run's log has no std: the table shows its mean, not a crash."""
    module = load_script()
    assert module.plus_minus({"mean": 46.774, "std": None}) == "46.77"
    assert module.plus_minus({"mean": 47.891, "std": 0.484}) == "47.89 ± 0.48"


def harness(data: Path, results: Path, work: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--gpu", "--device", "cpu", "--variants", "published",
                           "--data-dir", str(data), "--models", "pgt", "--seeds", "0", "--epochs", "1", "--results",
                           str(results), "--work", str(work), *options], capture_output=True, text=True, timeout=600)


FIXED_FORM = {"model", "engine", "options", "runs", "seeds", "epoch_s", "refit_epoch_s", "first_epoch_s", "samples_per_s",
              "test_forward_samples_per_s", "epochs_run", "strict", "protocol", "validation_strict_acc@1", "when", "machine"}


def test_the_gpu_harness_writes_each_configuration_in_the_fixed_form(tiny_sequences, tmp_path):
    """A dry run on the CPU: the resident, static-shape configuration becomes an entry of `configurations`; a
    second configuration is added beside it; the machine names torch and Ray; the GPU file is never written."""
    results = tmp_path / "gpu.json"
    done = harness(tiny_sequences, results, tmp_path / "work", "--resident-data", "--static-width", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(results.read_text())["configurations"]
    assert list(first) == ["pgt, in-process, resident_data=True, static_width=8"]
    entry = first["pgt, in-process, resident_data=True, static_width=8"]
    assert set(entry) == FIXED_FORM and entry["engine"] == "in-process" and entry["epoch_s"] > 0
    assert entry["options"] == {"resident_data": True, "static_width": 8} and entry["samples_per_s"] > 0
    assert 0 <= entry["strict"]["acc@1"]["mean"] <= entry["protocol"]["acc@1"]["mean"] <= 100
    assert entry["machine"]["torch"] == torch.__version__ and entry["machine"]["ray"] and entry["machine"]["gpu"] is None
    assert entry["machine"]["c_compiler"] and "triton" in entry["machine"]  # what --compile-model needs on a GPU
    done = harness(tiny_sequences, results, tmp_path / "work")
    assert done.returncode == 0, done.stderr[-3000:]
    both = json.loads(results.read_text())["configurations"]
    assert list(both) == ["pgt, in-process, resident_data=True, static_width=8", "pgt, in-process"]
    assert both["pgt, in-process, resident_data=True, static_width=8"] == entry  # kept as it was
    refused = run("--gpu", "--device", "cpu", "--variants", "published", "--data-dir", str(tiny_sequences))
    assert refused.returncode != 0 and "--device cpu is a dry run of the GPU harness" in refused.stderr


@pytest.mark.slow
def test_the_gpu_harness_trains_under_ray_train(tiny_sequences, tmp_path, on_shared_ray):
    """--engine ray-train: one TorchTrainer worker (on the Ray that $RAY_ADDRESS names); its entry says so."""
    results = tmp_path / "gpu.json"
    done = harness(tiny_sequences, results, tmp_path / "work", "--engine", "ray-train", "--resident-data")
    assert done.returncode == 0, done.stderr[-3000:]
    entry = json.loads(results.read_text())["configurations"]["pgt, ray-train, resident_data=True"]
    assert entry["engine"] == "ray-train" and entry["epochs_run"] == 1 and entry["samples_per_s"] > 0
    assert entry["epoch_s"] == entry["first_epoch_s"] > 0 and entry["refit_epoch_s"] is None  # one epoch, no refit
    assert any((tmp_path / "work").rglob("epoch_000"))  # Ray Train's checkpoint folder


def test_each_finished_run_is_handed_on_at_once(tiny_sequences, tmp_path):
    """run_models calls on_row after every run with the rows so far: the GPU harness writes its file then, so
    a run cut short by a machine's time limit keeps the seeds it finished."""
    bench = load_script()
    seen = []
    rows = bench.run_models(["pgt"], [0, 1], tiny_sequences, 1, "test", work=tmp_path,
                            on_row=lambda so_far: seen.append([r["seed"] for r in so_far]))
    assert seen == [[0], [0, 1]] and [r["seed"] for r in rows] == [0, 1]


def test_a_recipe_file_names_its_row_and_trains_its_settings(tiny_sequences, tmp_path):
    """MODEL:FILE.yaml trains the recipe file's settings (a sweep's winner), its row named by the file's stem."""
    bench = load_script()
    recipe = tmp_path / "winner.yaml"
    recipe.write_text("d_model: 32\nnhead: 1\ndim_feedforward: 64\n")
    rows = bench.run_models([f"pgt:{recipe}"], [0], tiny_sequences, 1, "test", work=tmp_path / "work")
    assert [r["model"] for r in rows] == ["pgt (winner)"] and bench.is_recipe_file(str(recipe))
    assert rows[0]["parameters"] < bench.run_models(["pgt"], [0], tiny_sequences, 1, "test",
                                                    work=tmp_path / "work")[0]["parameters"]


def readme_accuracy_rows() -> dict[str, list[str]]:
    """The README's accuracy table: each row's label (bold marks dropped) and its cells as written."""
    lines = (SCRIPT.parents[1] / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| | strict Acc@1 |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        label, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[label.replace("**", "")] = cells
    return rows


def summary_row(label: str) -> str:
    """The train.json row a README label names: its first recipe in backticks, the paper's, or the memory's."""
    if label == "PGT, the paper's recipe":
        return "pgt"
    if "long-term memory" in label:
        return "pgt (tuned-memory)"
    return f"pgt ({label.split('`')[1]})"


def test_the_readme_accuracy_table_is_train_json():
    """Every figure of the README's accuracy table is train.json's published variant to the digit (mean ± std over
    the seeds; the median epoch), the published runs are the benchmark's own constants, and the bold figure of each
    column is its best."""
    summary = json.loads((SCRIPT.parent / "results" / "train.json").read_text())["variants"]["published"]["summary"]
    published = load_script().PUBLISHED
    rows = readme_accuracy_rows()
    assert {"PGT, our `ensemble` recipe (`tuned`, 3 networks)", "PGT, our `tuned` recipe (one network)"} <= set(rows)

    def spread(figure: dict | None) -> str:
        return "" if figure is None else f"{figure['mean']:.2f} ± {figure['std']:.2f}"

    checked = 0
    for label, written in rows.items():
        cells = [cell.replace("**", "") for cell in written]
        if label == "best published PGT run":
            run = published["Pointer Generator Transformer (best published run)"]
            assert cells == [f"{run['strict']['acc@1']:.2f}", "", "", f"{run['acc@1']:.2f}", f"{run['mrr']:.2f}", ""]
            continue
        if label.startswith("LLM-Mob"):
            run = published["LLM-Mob (GPT-3.5)"]
            assert cells == [f"{run['strict']['acc@1']:.2f}", "", "", f"{run['acc@1']:.2f}", "", ""]
            continue
        row = summary[summary_row(label)]
        epoch = row.get("epoch_seconds_median")
        assert cells == [spread(row["strict"]["acc@1"]), spread(row["validation"]["strict_acc@1"]),
                         spread(row.get("deployment", {}).get("strict", {}).get("acc@1")), spread(row["acc@1"]),
                         spread(row["mrr"]), "" if epoch is None else f"{epoch:.2f}"], label
        checked += 1
    assert checked == len(rows) - 2
    ours = [cells for label, cells in rows.items() if label.startswith("PGT,")]
    for column in range(5):  # the bold figure of each metric column is the column's best mean
        cells = [row[column] for row in ours]
        means = [float(c.strip("*").split(" ")[0]) for c in cells if c]
        bold = [float(c.strip("*").split(" ")[0]) for c in cells if c.startswith("**")]
        assert bold == [max(means)], column
