"""Training: the loop per worker, its batches, the unseen-place simulation, baselines, and where it runs (one process
or Ray Train)."""
