"""Training: the data, the loop per worker, scoring and metrics, baselines, and where it runs (one process or
Ray Train)."""
