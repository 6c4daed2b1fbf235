"""Checkpoints load without running code: RNG states as tensors, weights_only=True, one-line errors for bad files."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from infra.errors import SettingsError
from pgt.config import TrainConfig
from pgt.network.checkpoint import check_resumable, load_checkpoint, read_checkpoint, rng_state, set_rng_state
from pgt.training.train import train_loop_per_worker


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state
    torch.save({"rng": rng_state()}, tmp_path / "rng.pt")
    expected = (random.random(), np.random.standard_normal(), torch.rand(1).item())
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.standard_normal(), torch.rand(1).item()) == expected


def test_training_checkpoints_and_best_pt_load_with_weights_only(synthetic_sequences, tmp_path):
    train_loop_per_worker({"data_dir": str(synthetic_sequences), "out_dir": str(tmp_path), "epochs": 1, "min_epochs": 1,
                           "d_model": 16, "nhead": 2, "dim_feedforward": 32})
    checkpoint = next((tmp_path / "checkpoints").glob("epoch_*/checkpoint.pt"))
    state = torch.load(checkpoint, weights_only=True)  # raises if anything in it needs unpickling of code
    assert state["epoch"] == 0 and isinstance(state["rng"]["numpy"]["keys"], torch.Tensor)
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    assert set(best) == {"model", "model_config", "config", "best_epoch"}


def test_a_checkpoint_written_under_a_settings_old_name_loads_and_resumes(synthetic_sequences, tmp_path):
    """A best.pt whose configs name the long-term memory's size memory_places (its name before memory_size) loads as
    the same model, and its training config counts as the same settings for resuming; another size is refused."""
    config = {"data_dir": str(synthetic_sequences), "out_dir": str(tmp_path), "epochs": 1, "min_epochs": 1,
              "d_model": 16, "nhead": 2, "dim_feedforward": 32, "memory_size": 4}
    train_loop_per_worker(config)
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    old = {**best, "model_config": {("memory_places" if k == "memory_size" else k): v
                                    for k, v in best["model_config"].items()},
           "config": {("memory_places" if k == "memory_size" else k): v for k, v in best["config"].items()}}
    assert "memory_size" not in old["model_config"] and old["model_config"]["memory_places"] == 4
    torch.save(old, tmp_path / "old.pt")
    model, cfg = load_checkpoint(tmp_path / "old.pt")
    assert cfg.memory_size == 4
    again, _ = load_checkpoint(tmp_path / "best.pt")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    check_resumable(old["config"], TrainConfig.from_dict(config), tmp_path / "old.pt")
    with pytest.raises(SettingsError, match="memory_size=4"):
        check_resumable(old["config"], TrainConfig.from_dict({**config, "memory_size": 8}), tmp_path / "old.pt")


@pytest.mark.parametrize("content,problem", [
    (b"", "unreadable checkpoint"),  # truncated to nothing
    (b"PK\x03\x04 not really a zip", "unreadable checkpoint"),
    (None, "not a pgt checkpoint (missing model_config"),  # a plain state_dict of another program
])
def test_a_corrupt_or_foreign_checkpoint_is_one_line_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "best.pt"
    if content is None:
        torch.save({"weight": torch.zeros(2)}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_checkpoint(path, required=("model_config", "model"))
    message = str(info.value)
    assert message.startswith(str(path)) and problem in message and "\n" not in message


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    """A pickle that calls a function on load: weights_only refuses it, nothing runs."""
    import pickle

    class Boom:
        def __reduce__(self):
            return (print, ("this must never print",))

    path = tmp_path / "evil.pt"
    with path.open("wb") as fh:
        pickle.dump({"model_config": Boom()}, fh)
    with pytest.raises(ValueError, match="unreadable checkpoint"):
        read_checkpoint(path, required=("model_config",))
