"""The resident-data and static-shape path (the GPU's), run on CPU: the same batches as the DataLoader path,
a few fixed shapes with static_width, the same model outputs, and the same training."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pgt.config import TrainConfig
from pgt.data import FirstVisits, ResidentBatches, UnseenSimulation, Vocab, load_splits
from pgt.model import build_model
from pgt.train import train_loader, train_loop_per_worker
from pgt.worker import Worker


def config(data_dir, tmp_path, **overrides) -> TrainConfig:
    return TrainConfig(data_dir=str(data_dir), out_dir=str(tmp_path), batch_size=32, **overrides)


@pytest.fixture(scope="module")
def train_set(synthetic_sequences):
    return load_splits(synthetic_sequences, names=("train",))["train"]


@pytest.mark.parametrize("rank", [0, 1])
def test_resident_batches_are_the_loaders_batches(synthetic_sequences, train_set, tmp_path, rank):
    """Without static_width: batch for batch, tensor for tensor, what the DataLoader gives (two workers' shards)."""
    worker = Worker(rank=rank, world_size=2)
    cfg = config(synthetic_sequences, tmp_path)
    loader = train_loader(train_set, cfg, worker)
    resident = train_loader(train_set, dataclasses.replace(cfg, resident_data=True), worker)
    assert isinstance(resident, ResidentBatches) and len(resident) == len(loader)
    for epoch in (0, 3):
        loader.batch_sampler.set_epoch(epoch)
        resident.batch_sampler.set_epoch(epoch)
        pairs = list(zip(loader, resident, strict=True))
        assert len(pairs) == len(loader) > 1
        for a, b in pairs:
            for x, y in zip(a, b):
                assert torch.equal(x, y)


def test_static_width_gives_few_shapes_every_sample_and_the_same_outputs(synthetic_sequences, train_set, tmp_path):
    """static_width 8: widths are multiples of 8 (or the split's width), every batch is full, every sample is in
    the epoch, and padding is masked: the model scores a widened batch as the batch itself."""
    cfg = config(synthetic_sequences, tmp_path, resident_data=True, static_width=8)
    resident = train_loader(train_set, cfg, Worker())
    batches = list(resident)
    full_width = train_set.locations.shape[1]
    assert {b.locations.shape[0] for b in batches} == {32}
    assert all(b.locations.shape[1] % 8 == 0 or b.locations.shape[1] == full_width for b in batches)
    assert len({b.locations.shape[1] for b in batches}) <= -(-full_width // 8)
    planned, widths = resident.plan()
    seen = torch.as_tensor(sorted(set(int(i) for b in planned for i in b)))
    assert torch.equal(seen, torch.arange(len(train_set)))
    assert sum(len(b) for b in planned) - len(train_set) < 32  # only the short batch is filled

    model = build_model(cfg.model_config(Vocab.from_manifest(synthetic_sequences))).eval()
    idx = torch.as_tensor(planned[0])
    narrow = train_set.gather(idx, int(train_set.lengths[idx].max()))
    wide = train_set.gather(idx, widths[0] + 8 if widths[0] + 8 <= full_width else full_width)
    with torch.no_grad():
        a, b = model(*narrow.inputs()).log_probs, model(*wide.inputs()).log_probs
    assert torch.allclose(a, b, atol=1e-5)


def test_unseen_simulation_gathers_alike_on_the_resident_path(synthetic_sequences, train_set, tmp_path):
    """UnseenSimulation's draws come from the same generator on either path: the same simulated batch."""
    vocab = Vocab.from_manifest(synthetic_sequences)
    simulated = UnseenSimulation(train_set, FirstVisits.from_data_dir(synthetic_sequences, vocab), 0.5, 0.9)
    indices = list(range(0, len(train_set), 3))[:40]
    torch.manual_seed(5)
    a = simulated.__getitems__(indices)
    torch.manual_seed(5)
    moved = simulated.to("cpu")
    b = moved.gather(torch.as_tensor(indices), int(train_set.lengths[indices].max()))
    assert (a.locations == 1).any()  # the simulation turned places into "unseen"
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_resident_training_is_the_loaders_training(synthetic_sequences, tmp_path):
    """Two epochs with the tuned recipe's unseen simulation: resident_data alone trains bit for bit as the
    DataLoader path; with static_width too, the same samples in wider, fuller batches land close."""
    common = dict(epochs=2, min_epochs=2, simulate_unseen=True, evaluate_test=False)
    plain = train_loop_per_worker(config(synthetic_sequences, tmp_path / "a", **common).to_dict(), Worker())
    resident = train_loop_per_worker(config(synthetic_sequences, tmp_path / "b", resident_data=True, **common).to_dict(),
                                     Worker())
    static = train_loop_per_worker(config(synthetic_sequences, tmp_path / "c", resident_data=True, static_width=16,
                                          **common).to_dict(), Worker())
    assert [r["train_loss"] for r in resident["history"]] == [r["train_loss"] for r in plain["history"]]
    assert resident["validation"]["strict"]["acc@1"] == plain["validation"]["strict"]["acc@1"]
    assert static["history"][-1]["train_loss"] < static["history"][0]["train_loss"]
    assert abs(static["validation"]["strict"]["acc@1"] - plain["validation"]["strict"]["acc@1"]) <= 5.0


def test_static_width_needs_resident_data_and_streaming_refuses_it(synthetic_sequences, tmp_path):
    with pytest.raises(ValueError, match="static_width pads the batches of resident_data"):
        config(synthetic_sequences, tmp_path, static_width=8)
    from pgt.config import LaunchConfig
    from pgt.distributed import run_training

    with pytest.raises(ValueError, match="resident_data holds the train split on the device"):
        run_training(config(synthetic_sequences, tmp_path, resident_data=True),
                     LaunchConfig(workers=2, data_engine="ray"))
