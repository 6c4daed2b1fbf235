"""Checkpoints: what an epoch writes and a resumption or a user reads back.

A checkpoint is a dict of tensors and plain values saved with torch.save and read with
`torch.load(weights_only=True)`: no pickled code runs when it is loaded. Epoch checkpoints
(checkpoints/epoch_NNN/checkpoint.pt) hold everything a resumption needs (CHECKPOINT_KEYS); best.pt holds
the best epoch's weights with the model and training configs.
"""

from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path

import numpy as np
import torch

from infra.errors import InputError, SettingsError
from infra.output import write_file_atomically
from infra.process import uninterrupted
from infra.settings import stored_settings
from pgt.config import ModelConfig, TrainConfig
from pgt.network.model import build_model


def rng_state() -> dict:
    """Every generator's state as tensors and plain numbers, which `torch.load(weights_only=True)` reads back."""
    version, words, gauss = random.getstate()
    _, keys, position, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": version, "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
             "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    python, numpy = state["python"], state["numpy"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"], numpy["has_gauss"],
                         numpy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "scaler", "epoch", "best_metric", "best_epoch", "bad_epochs",
                   "history", "best_model", "rng", "config")


def read_checkpoint(path: Path | str, device: torch.device | str = "cpu", required: tuple[str, ...] = CHECKPOINT_KEYS) -> dict:
    """A checkpoint or best.pt read without running code (`weights_only=True`). A missing, corrupt or foreign
    file raises InputError in one line naming it."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "no such checkpoint")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for truncated, foreign or unsafe files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(path, f"unreadable checkpoint ({type(exc).__name__}: {first[:200]})") from None
    missing = [key for key in required if not isinstance(state, dict) or key not in state]
    if missing:
        raise InputError(path, f"not a pgt checkpoint (missing {', '.join(missing)})")
    return state


def latest_checkpoint(out_dir: Path, storage: Path | str = "checkpoints") -> Path | None:
    """The newest epoch_NNN/checkpoint.pt under out_dir/storage: the folder of runs without Ray by default, or Ray
    Train's storage of a run under it (ray/train)."""
    found = sorted((Path(out_dir) / storage).glob("epoch_*/checkpoint.pt"))
    return found[-1] if found else None


def write_torch_file(state: dict, path: Path) -> Path:
    """torch.save into memory, then the bytes to a temporary sibling renamed over `path`: a full or read-only disk
    raises an OSError naming `path` (torch's own writer says only "unexpected pos") and leaves nothing behind."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return write_file_atomically(Path(path), lambda tmp: tmp.write_bytes(buffer.getbuffer()))


def save_checkpoint(state: dict, out_dir: Path, epoch: int, keep: int) -> Path:
    """Write checkpoints/epoch_NNN/checkpoint.pt atomically and prune older ones (a signal meanwhile takes
    effect after both, so that no epoch's folder is left half pruned)."""
    folder = out_dir / "checkpoints" / f"epoch_{epoch:03d}"
    with uninterrupted():
        try:
            write_torch_file(state, folder / "checkpoint.pt")
        except BaseException:
            with contextlib.suppress(OSError):
                folder.rmdir()  # the epoch's folder, when it holds nothing
            raise
        for old in sorted((out_dir / "checkpoints").glob("epoch_*"))[:-keep]:
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    return folder


# settings that may differ between a run and its resumption (compile_model, capture_step: how the same step is computed)
RESUMABLE_CHANGES = {"out_dir", "epochs", "resume", "threads", "keep_checkpoints", "eval_batch_size", "evaluate_test",
                     "compile_model", "capture_step"}


def check_resumable(saved: dict, cfg: TrainConfig, path: Path, ignore: frozenset = frozenset()) -> None:
    """SettingsError unless the checkpoint was trained with these settings (a setting it predates counts as its
    default); `ignore`: settings the caller knows may differ as well."""
    current = cfg.to_dict()
    saved = {**TrainConfig.from_dict({"data_dir": ".", "out_dir": "."}).to_dict(), **stored_settings(saved)}
    changed = sorted(k for k in current if k not in RESUMABLE_CHANGES | ignore and saved.get(k) != current[k])
    if changed:
        raise SettingsError(f"{path} was trained with other settings ({', '.join(f'{k}={saved.get(k)!r}' for k in changed)}); "
                            "use --no-resume or another --out")


def load_checkpoint(path: Path | str, device: str = "cpu", epoch_weights: bool = False
                    ) -> tuple[torch.nn.Module, ModelConfig]:
    """A model from best.pt or an epoch checkpoint (both hold model_config and the weights): an epoch checkpoint's
    best weights so far, or with `epoch_weights` that epoch's own."""
    state = read_checkpoint(path, device, ("model_config", "model"))
    try:
        cfg = ModelConfig(**stored_settings(state["model_config"]))
        model = build_model(cfg)
        model.load_state_dict(state["model"] if epoch_weights else state.get("best_model") or state["model"])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InputError(path, f"not a checkpoint of this pgt ({str(exc).splitlines()[0]})") from None
    return model.eval(), cfg
