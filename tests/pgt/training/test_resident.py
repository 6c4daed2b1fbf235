"""The resident-data and static-shape path (the GPU's), run on CPU: the same batches as the DataLoader path,
a few fixed shapes with static_width, the same model outputs, and the same training."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pgt.config import TrainConfig
from pgt.data.dataset import Vocab, load_splits
from pgt.network.model import EPS, build_model
from pgt.training.batches import ResidentBatches
from pgt.training.loss import batch_loss, criterion
from pgt.training.state import train_loader
from pgt.training.train import train_loop_per_worker
from pgt.training.unseen import FirstVisits, UnseenSimulation
from pgt.training.worker import Worker


def config(data_dir, tmp_path, **overrides) -> TrainConfig:
    return TrainConfig.from_dict({"data_dir": str(data_dir), "out_dir": str(tmp_path), "batch_size": 32, **overrides})


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


@pytest.mark.parametrize("members", [1, 2])
def test_padded_slot_columns_change_neither_the_scores_nor_the_loss(synthetic_sequences, tmp_path, members):
    """pad_slots (static_width's): the output is (B, V + T) whatever the batch's slots, its first V + S columns are
    the unpadded output and the rest hold nothing; the loss (label smoothing over the real columns) and its
    gradients are those of the unpadded output. Validation has unseen places, so its batches have slots."""
    cfg = TrainConfig.from_recipe("tuned", data_dir=str(synthetic_sequences), out_dir=str(tmp_path),
                                  resident_data=True, static_width=8, members=members, d_model=32, nhead=2)
    plain_cfg = dataclasses.replace(cfg, static_width=0)
    model_cfg = cfg.model_config(Vocab.from_manifest(synthetic_sequences))
    validation = load_splits(synthetic_sequences, names=("validation",))["validation"]
    batch = validation.__getitems__(list(range(min(64, len(validation)))))
    V, (B, T), S = model_cfg.num_locations, batch.locations.shape, int(batch.slots.max())
    assert 0 < S < T  # the batch has slots, and fewer than T: padding adds columns
    torch.manual_seed(0)
    model = build_model(model_cfg).eval()  # no dropout: the two passes are the same computation
    plain = model(*batch.inputs())
    loss = criterion(plain.log_probs, batch, model_cfg, plain_cfg)
    plain_grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    padded = model(*batch.inputs(), pad_slots=True)
    padded_loss = criterion(padded.log_probs, batch, model_cfg, cfg)
    padded_grads = torch.autograd.grad(padded_loss, list(model.parameters()), allow_unused=True)

    assert plain.log_probs.shape == (B, V + S) and padded.log_probs.shape == (B, V + T)
    assert torch.equal(padded.log_probs[:, :V + S], plain.log_probs)
    assert torch.all(padded.log_probs[:, V + S:] == torch.log(torch.tensor(EPS)))
    assert torch.allclose(padded_loss, loss, rtol=1e-6)
    assert not torch.allclose(criterion(padded.log_probs, batch, model_cfg, plain_cfg), loss, rtol=1e-6)  # unmasked
    largest = max(float(g.abs().max()) for g in plain_grads if g is not None)
    for a, b in zip(plain_grads, padded_grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert float((a - b).abs().max()) <= 1e-5 * largest  # float rounding only


@pytest.mark.parametrize("recipe", ["tuned", "ensemble"])
def test_the_padded_training_pass_is_one_graph(synthetic_sequences, tmp_path, recipe):
    """What a CUDA graph needs: with static_width the recipe's training step (the pass with pad_slots and the loss)
    traces as one graph with no break (no host sync inside); without it, the batch's slot count (a .item())
    breaks it."""
    import torch._dynamo

    cfg = TrainConfig.from_recipe(recipe, data_dir=str(synthetic_sequences), out_dir=str(tmp_path), d_model=32, nhead=2,
                                  resident_data=True, static_width=16)
    model_cfg = cfg.model_config(Vocab.from_manifest(synthetic_sequences))
    model = build_model(model_cfg).train()
    validation = load_splits(synthetic_sequences, names=("validation",))["validation"]
    batch = validation.__getitems__(list(range(min(64, len(validation)))))
    padded = torch._dynamo.explain(batch_loss)(model, batch, model_cfg, cfg)
    assert (padded.graph_count, padded.graph_break_count) == (1, 0), [r.reason for r in padded.break_reasons]
    plain = torch._dynamo.explain(batch_loss)(model, batch, model_cfg, dataclasses.replace(cfg, static_width=0))
    assert plain.graph_break_count > 0


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
    from pgt.training.run import run_training

    with pytest.raises(ValueError, match="resident_data holds the train split on the device"):
        run_training(config(synthetic_sequences, tmp_path, resident_data=True),
                     LaunchConfig(workers=2, data_engine="ray"))


@pytest.mark.slow
def test_compiled_training_learns_as_the_model_does(synthetic_sequences, tmp_path):
    """compile_model: the training pass runs as compiled graphs (one per batch width), learns as the eager pass
    does (close, not equal: dropout masks come from inductor's own generator) and writes the model itself:
    best.pt loads into build_model, and a run resumes its checkpoint without compile_model."""
    from torch._dynamo.utils import counters

    from pgt.network.checkpoint import load_checkpoint

    common = dict(epochs=2, min_epochs=2, simulate_unseen=True, evaluate_test=False, resident_data=True,
                  static_width=64, d_model=32, nhead=2)  # one width: one graph to compile
    eager = train_loop_per_worker(config(synthetic_sequences, tmp_path / "eager", **common).to_dict(), Worker())
    counters.clear()
    torch._dynamo.reset()
    fast = train_loop_per_worker(config(synthetic_sequences, tmp_path / "compiled", compile_model=True,
                                        **common).to_dict(), Worker())
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo compiled the training pass
    losses = [r["train_loss"] for r in fast["history"]]
    assert losses[1] < losses[0]
    for a, b in zip(losses, [r["train_loss"] for r in eager["history"]], strict=True):
        assert abs(a - b) <= 0.05 * b
    assert abs(fast["validation"]["strict"]["acc@1"] - eager["validation"]["strict"]["acc@1"]) <= 5.0
    model, _ = load_checkpoint(tmp_path / "compiled" / "best.pt")  # the model's own keys, no compile wrapper
    assert model.cfg.d_model == 32
    longer = train_loop_per_worker(config(synthetic_sequences, tmp_path / "compiled", **{**common, "epochs": 3}).to_dict(),
                                   Worker())
    assert longer["resumed_at_epochs"] == [3] and longer["epochs_run"] == 3
