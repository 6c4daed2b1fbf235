"""The whole step (capture_step) and fused seeds (fused_seeds) train the same model as the plain loop: on a CPU
the step that CUDA captures runs as it is and must give the plain loop's weights bit for bit; on a GPU (where one
is present) the captured step must give the uncaptured one's within float tolerance. Fused seeds: each network
learns exactly as that seed's network alone on the same batches."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pgt.config import TrainConfig
from pgt.network.model import networks
from pgt.training.state import fused_seed_model, setup
from pgt.training.step import WholeStep, portable_optimizer_state
from pgt.training.train import train_epoch, train_loop_per_worker
from pgt.training.worker import Worker

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def config(data_dir, out_dir, **overrides) -> dict:
    return TrainConfig.from_dict({"data_dir": str(data_dir), "out_dir": str(out_dir), "batch_size": 32,
                                  "resident_data": True, "static_width": 16, "d_model": 32, "nhead": 2,
                                  "evaluate_test": False, **overrides}).to_dict()


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


TUNED_LIKE = dict(unseen_slots=True, simulate_unseen=True, new_place_weight=0.5, visit_relations=True,
                  relation_inputs=True, dropout=0.4, label_smoothing=0.1)


@pytest.mark.parametrize("overrides", [TUNED_LIKE, {**TUNED_LIKE, "members": 2, "weight_average": 0.9}],
                         ids=["tuned", "ensemble-averaged"])
def test_the_whole_step_on_a_cpu_trains_the_plain_loops_weights(synthetic_sequences, tmp_path, overrides):
    """Two epochs of the tuned recipe's switches (dropout and the unseen simulation drawing from the generator),
    and an averaged ensemble: the whole step's weights, losses and learning rates are the plain loop's, exactly
    (the same ops in the same order on a CPU)."""
    runs = {}
    for capture in (False, True):
        state = setup(config(synthetic_sequences, tmp_path / str(capture), capture_step=capture, seed=3, **overrides),
                      Worker())
        assert (state.whole_step is not None) == capture
        rows = [train_epoch(state, epoch) for epoch in range(2)]
        runs[capture] = (state, rows)
    (plain, plain_rows), (whole, whole_rows) = runs[False], runs[True]
    assert [r["train_loss"] for r in whole_rows] == [r["train_loss"] for r in plain_rows]
    assert [r["lr"] for r in whole_rows] == [r["lr"] for r in plain_rows]
    assert isinstance(whole_rows[0]["lr"], float)
    assert max_difference(weights(whole.model), weights(plain.model)) == 0.0
    if whole.averaged is not None:
        assert max_difference(weights(whole.averaged), weights(plain.averaged)) == 0.0
    assert whole_rows[-1]["validation"] == plain_rows[-1]["validation"]
    assert plain_rows[0]["samples"] == whole_rows[0]["samples"] > 0
    assert whole.whole_step.replays == 0  # nothing is captured on a CPU: each step ran as it is


def test_a_captured_runs_checkpoint_resumes_without_capture_and_back(synthetic_sequences, tmp_path):
    """The checkpoint holds the learning rate as a float (portable_optimizer_state), so a capture_step run's
    checkpoint resumes without it, and that one's with it again: the history is, epoch for epoch, that of the same
    runs without capture_step (3 epochs, resumed for a 4th, then a 5th)."""
    common = dict(min_epochs=3, warmup_epochs=2)
    chains = {}
    for name, captures in (("mixed", (True, False, True)), ("plain", (False, False, False))):
        for epochs, capture in zip((3, 4, 5), captures):
            result = train_loop_per_worker(config(synthetic_sequences, tmp_path / name, capture_step=capture,
                                                  epochs=epochs, **common), Worker())
            if name == "mixed" and epochs == 3:
                saved = torch.load(sorted((tmp_path / name / "checkpoints").glob("epoch_*/checkpoint.pt"))[-1],
                                   weights_only=False)
                assert all(isinstance(g["lr"], float) for g in saved["optimizer"]["param_groups"])
        chains[name] = result
    mixed, plain = chains["mixed"], chains["plain"]
    assert mixed["resumed_at_epochs"] == plain["resumed_at_epochs"] == [4, 5] and mixed["epochs_run"] == 5
    assert [r["lr"] for r in mixed["history"]] == [r["lr"] for r in plain["history"]]
    assert [r["train_loss"] for r in mixed["history"]] == [r["train_loss"] for r in plain["history"]]


def test_portable_optimizer_state_keeps_the_optimizer_untouched():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01))
    saved = portable_optimizer_state(optimizer)
    assert saved["param_groups"][0]["lr"] == pytest.approx(0.01) and isinstance(saved["param_groups"][0]["lr"], float)
    assert isinstance(optimizer.param_groups[0]["lr"], torch.Tensor)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device; none here")
def test_the_captured_step_on_a_gpu_trains_the_uncaptured_steps_weights(synthetic_sequences, tmp_path):
    """On CUDA: every width is captured after its warm-up steps and replayed, and the weights after two epochs are
    the uncaptured step's within bfloat16 tolerance (dropout off and no simulation: a graph's random draws need not
    be the eager ones)."""
    overrides = {**TUNED_LIKE, "dropout": 0.0, "simulate_unseen": False}
    states = {}
    for capture in (False, True):
        worker = Worker(device=torch.device("cuda"))
        state = setup(config(synthetic_sequences, tmp_path / str(capture), capture_step=capture, seed=5,
                             **overrides), worker)
        rows = [train_epoch(state, epoch) for epoch in range(2)]
        states[capture] = (state, rows)
    (plain, plain_rows), (whole, whole_rows) = states[False], states[True]
    assert whole.whole_step.replays > 0 and whole.whole_step.graphs
    for a, b in zip(whole_rows, plain_rows, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=2e-3)
    assert max_difference(weights(whole.model), weights(plain.model)) < 2e-2


def test_fused_seeds_draw_each_network_as_its_seed_alone(synthetic_sequences, tmp_path):
    """Network i of a fused model is the network a run of seed + i draws, and the first seed's generator then goes
    on as in that run (the same batches and dropout draws)."""
    fused = setup(config(synthetic_sequences, tmp_path / "fused", fused_seeds=3, seed=7), Worker())
    # the run's model config is each seed's network (members names an ensemble's size, not fused seeds)
    assert fused.model_cfg.members == 1 and len(networks(fused.model)) == 3
    for i, net in enumerate(networks(fused.model)):
        alone = setup(config(synthetic_sequences, tmp_path / f"alone{i}", seed=7 + i), Worker())
        assert max_difference(weights(net), weights(alone.model)) == 0.0
    # the first seed's generator goes on as in its run alone: the next draw is the same
    fused_next = (setup(config(synthetic_sequences, tmp_path / "f2", fused_seeds=3, seed=7), Worker()), torch.rand(4))[1]
    alone_next = (setup(config(synthetic_sequences, tmp_path / "a2", seed=7), Worker()), torch.rand(4))[1]
    assert torch.equal(fused_next, alone_next)
    two = fused_seed_model(fused.model_cfg, 7, 2)
    assert max_difference(weights(two.members[1]), weights(networks(fused.model)[1])) == 0.0


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "whole-step"])
def test_fused_seeds_learn_as_each_seed_alone_on_the_same_batches(synthetic_sequences, tmp_path, capture):
    """Without dropout, two fused seeds' networks after an epoch of steps are the networks of two runs of those
    seeds fed the same batches (each its own loss, clipping and AdamW state: nothing leaks between them)."""
    common = dict(dropout=0.0, unseen_slots=True, visit_relations=True, capture_step=True, seed=11)
    fused = setup(config(synthetic_sequences, tmp_path / "fused", fused_seeds=2, **common), Worker())
    alone = [setup(config(synthetic_sequences, tmp_path / f"alone{i}", **{**common, "seed": 11 + i}), Worker())
             for i in range(2)]
    fused.loader.batch_sampler.set_epoch(0)
    steps = 0
    for idx, width in fused.loader.indices():
        for state in (fused, *alone):
            if capture:
                state.whole_step(idx, width)
            else:
                WholeStep.step(state.whole_step, idx, width)
        steps += 1
    assert steps > 2
    for net, single in zip(networks(fused.model), alone, strict=True):
        assert max_difference(weights(net), weights(single.model)) < 1e-5
    assert max_difference(weights(networks(fused.model)[0]), weights(networks(fused.model)[1])) > 1e-3


def test_a_fused_seed_run_scores_each_seed_apart(synthetic_sequences, tmp_path):
    """metrics.json of fused_seeds 2: each seed's own best epoch and validation figures, their mean as the run's,
    the per-seed rows in the history, and no best.pt (several seeds' evidence, not one model)."""
    out = tmp_path / "fused"
    result = train_loop_per_worker(config(synthetic_sequences, out, fused_seeds=2, epochs=3, min_epochs=3, seed=1,
                                          evaluate_test=True, capture_step=True), Worker())
    written = json.loads((out / "metrics.json").read_text())
    assert written["fused_seeds"] == 2 and [s["seed"] for s in written["seeds"]] == [1, 2]
    strict = [s["validation"]["strict"]["acc@1"] for s in written["seeds"]]
    assert written["validation"]["strict"]["acc@1"] == pytest.approx(sum(strict) / 2)
    assert all(1 <= s["best_epoch"] <= 3 and s["test"] is not None for s in written["seeds"])
    assert set(written["seeds"][0]["deployment"]) == {"validation", "test"}
    assert all(len(row["seeds"]) == 2 for row in written["history"])
    best = [max(range(3), key=lambda e, i=i: (written["history"][e]["seeds"][i]["validation_strict_acc@1"], -e))
            for i in range(2)]
    assert [s["best_epoch"] for s in written["seeds"]] == [b + 1 for b in best]  # each seed's own best epoch
    assert not (out / "best.pt").exists()
    assert result["epochs_run"] == 3 and math.isfinite(result["history"][-1]["train_loss"])


def test_fused_seeds_and_capture_step_refuse_what_they_cannot_do(tmp_path):
    base = {"data_dir": ".", "out_dir": "."}
    with pytest.raises(ValueError, match="fused_seeds .* not with refit"):
        TrainConfig.from_dict({**base, "fused_seeds": 3, "refit": True})
    with pytest.raises(ValueError, match="members > 1"):
        TrainConfig.from_dict({**base, "fused_seeds": 3, "members": 2})
    with pytest.raises(ValueError, match="not a neural model"):
        TrainConfig.from_dict({**base, "fused_seeds": 2, "model": "markov"})
    with pytest.raises(ValueError, match="capture_step captures one graph per batch shape"):
        TrainConfig.from_dict({**base, "capture_step": True})
    assert TrainConfig.from_dict({**base, "fused_seeds": 1, "refit": True}).fused_seeds == 1
