"""`pgt evaluate`: the metrics, protocol and strict, of a model logged in MLflow on one split."""

from __future__ import annotations

from pathlib import Path

import torch

from pgt.config import EVAL_BATCH_SIZE
from pgt.data.dataset import MemoryLayout, SequenceDataset
from pgt.data.metrics import compute_all
from pgt.data.scoring import packed_scores, score_dataset
from pgt.serving.inference import check_lineage, check_vocabulary, live_folder
from pgt.serving.models import load_model_and_manifest


def evaluate_model(model_uri: str, data_dir: Path, split: str = "test", tracking_uri: str | None = None) -> dict:
    """The metrics, protocol and strict, for a logged PackedModel on one split of a `pgt preprocess` folder (with
    a live prediction's inputs where the folder is an output of `--fitted`: inference.live_folder)."""
    SequenceDataset.check_columns(Path(data_dir) / f"{split}.parquet")
    model, trained_on = load_model_and_manifest(model_uri, tracking_uri)
    check_lineage(trained_on, Path(data_dir), model_uri)
    dataset = SequenceDataset.from_parquet(Path(data_dir) / f"{split}.parquet", model.cfg.max_len,
                                           memory=MemoryLayout.of(model.cfg))
    check_vocabulary(model.cfg, dataset, Path(data_dir) / f"{split}.parquet")
    scored, _ = score_dataset(packed_scores(model, live=live_folder(Path(data_dir))), dataset, EVAL_BATCH_SIZE,
                              torch.device("cpu"))
    return compute_all(scored)
