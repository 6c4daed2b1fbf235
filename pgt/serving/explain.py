"""`pgt explain`: the plots a researcher looks at, as PNGs.

- pointer_attention.png: pointer attention over the history of several test samples, each bar
  labelled with its location id, the target's visits highlighted;
- gate.png: the gate (weight of the pointer; an ensemble's mean) split by whether the target is in the history;
- position_bias.png: the learned position-from-end bias of the pointer scores (an ensemble's mean);
- attention_entropy.png: the entropy of the pointer attention, against the uniform maximum.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after matplotlib.use("Agg")
import numpy as np  # noqa: E402 - after matplotlib.use("Agg")
import torch  # noqa: E402 - after matplotlib.use("Agg")

from infra.errors import InputError
from infra.output import (  # noqa: E402 - after matplotlib.use("Agg")
    PRODUCER_KEY,
    check_apart,
    check_output_entries,
    check_output_file,
    output_lock,
    write_file_atomically,
)
from pgt.config import EVAL_BATCH_SIZE  # noqa: E402 - after matplotlib.use("Agg")
from pgt.data.dataset import MemoryLayout, SequenceDataset
from pgt.network.checkpoint import load_checkpoint  # noqa: E402 - after matplotlib.use("Agg")
from pgt.network.model import networks  # noqa: E402 - after matplotlib.use("Agg")
from pgt.serving.inference import check_vocabulary  # noqa: E402 - after matplotlib.use("Agg")

EXPLAINER = "pgt explain"  # the producer mark of its PNGs (infra.output.written_by)
OUTPUTS = ("pointer_attention.png", "gate.png", "attention_entropy.png", "position_bias.png", ".*.tmp-*")


@torch.no_grad()
def collect(model: torch.nn.Module, dataset: SequenceDataset, batch_size: int = EVAL_BATCH_SIZE) -> dict[str, np.ndarray]:
    gates, entropy, lengths, attention = [], [], [], []
    for start in range(0, len(dataset), batch_size):
        batch = dataset.__getitems__(list(range(start, min(len(dataset), start + batch_size))))
        out = model(*batch.inputs())
        a = out.attention.clamp_min(1e-12)
        gates.append(out.gate.numpy())
        entropy.append((-(out.attention * a.log()).sum(dim=1)).numpy())
        lengths.append((batch.locations != 0).sum(dim=1).numpy())
        attention.extend(out.attention[i, : lengths[-1][i]].numpy() for i in range(len(batch.targets)))
    return {"gate": np.concatenate(gates), "entropy": np.concatenate(entropy), "length": np.concatenate(lengths),
            "attention": attention, "in_history": dataset.in_history()}


def explain(checkpoint: Path | str, data_dir: Path | str, out_dir: Path | str, samples: int = 6, seed: int = 0) -> list[Path]:
    """The PNGs of the module docstring in out_dir, which must hold nothing but them (InputError otherwise)."""
    check_apart(Path(out_dir), {"--checkpoint": checkpoint, "--data": data_dir})
    check_output_entries(Path(out_dir), EXPLAINER, OUTPUTS)
    for name in OUTPUTS[:-1]:  # a PNG of that name that someone else wrote is not replaced either
        check_output_file(Path(out_dir) / name, EXPLAINER, (".png",))
    model, cfg = load_checkpoint(checkpoint)
    dataset = SequenceDataset.from_parquet(Path(data_dir) / "test.parquet", cfg.max_len, memory=MemoryLayout.of(cfg))
    if len(dataset) == 0:
        raise InputError(Path(data_dir) / 'test.parquet', "no samples to explain")
    check_vocabulary(cfg, dataset, Path(data_dir) / "test.parquet")  # another run's ids would index past the tables
    out_dir = Path(out_dir)
    with output_lock(out_dir, command=EXPLAINER):  # one writer: a second is refused, naming the first
        out_dir.mkdir(parents=True, exist_ok=True)
        c = collect(model, dataset)
        title = f"{cfg.variant}, d={cfg.d_model}" + (f", {cfg.members} members" if cfg.members > 1 else "")
        written = [
            _pointer_attention(dataset, c, out_dir / "pointer_attention.png", samples, seed, title),
            _gate(c, out_dir / "gate.png", title),
            _attention_entropy(c, out_dir / "attention_entropy.png", title),
        ]
        if hasattr(networks(model)[0], "position_bias"):
            written.append(_position_bias(model, c, out_dir / "position_bias.png", title))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    write_file_atomically(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png",
                                                        metadata={PRODUCER_KEY.decode(): EXPLAINER}))
    plt.close(fig)
    return path


def _pointer_attention(dataset, c, path, samples, seed, title) -> Path:
    rng = np.random.default_rng(seed)
    candidates = np.flatnonzero(c["in_history"] & (c["length"] >= 5) & (c["length"] <= 25))
    if len(candidates) == 0:
        candidates = np.arange(len(dataset))
    chosen = rng.choice(candidates, size=min(samples, len(candidates)), replace=False)
    cols = 2
    rows = -(-len(chosen) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.6 * rows), squeeze=False)
    for ax, i in zip(axes.flat, chosen):
        n = int(c["length"][i])
        locs = dataset.locations[i, :n].numpy()
        target = int(dataset.targets[i])
        colors = ["tab:red" if loc == target else "tab:blue" for loc in locs]
        ax.bar(np.arange(n), c["attention"][i], color=colors)
        ax.set_xticks(np.arange(n), [f"L{loc}" for loc in locs], rotation=90, fontsize=7)
        ax.set_ylabel("attention")
        ax.set_title(f"sample {i}: target L{target}, gate {c['gate'][i]:.2f}", fontsize=9)
    for ax in list(axes.flat)[len(chosen):]:
        ax.axis("off")
    fig.suptitle(f"Pointer attention over the history (oldest left; red = the target's location) - {title}")
    return _save(fig, path)


def _gate(c, path, title) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.linspace(0, 1, 41)
    inside = c["in_history"].astype(bool)
    ax.hist(c["gate"][inside], bins=bins, alpha=0.7, label=f"target in history (n={inside.sum()})")
    ax.hist(c["gate"][~inside], bins=bins, alpha=0.7, label=f"target not in history (n={(~inside).sum()})")
    ax.set_xlabel("gate g (weight of the pointer distribution)")
    ax.set_ylabel("test samples")
    ax.set_title(f"Pointer-generator gate - {title}")
    ax.legend()
    return _save(fig, path)


def _position_bias(model, c, path, title) -> Path:
    bias = torch.stack([net.position_bias.detach() for net in networks(model)]).mean(0).numpy()  # an ensemble's mean
    longest = max(int(c["length"].max()), 2)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(1, longest + 1), bias[1 : longest + 1], marker="o", markersize=3)
    ax.set_xlabel("position from the end (1 = the last visit)")
    ax.set_ylabel("learned bias added to the pointer score")
    ax.set_title(f"Position-from-end bias - {title}")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _attention_entropy(c, path, title) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(c["entropy"], bins=40, alpha=0.8, label="pointer attention")
    ax.hist(np.log(c["length"]), bins=40, alpha=0.4, label="uniform over the history (maximum)")
    ax.set_xlabel("entropy (nats)")
    ax.set_ylabel("test samples")
    ax.set_title(f"Pointer-attention entropy - {title}")
    ax.legend()
    return _save(fig, path)
