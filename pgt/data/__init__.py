"""The data as the model reads it, below training, tracking and serving: the splits as padded tensors (`Batch`,
`Vocab`, `SequenceDataset`, the memory's layout), and scoring and the metrics it feeds."""
