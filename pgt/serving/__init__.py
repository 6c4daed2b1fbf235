"""A trained model at work: inference, `pgt predict`, `pgt evaluate`, `pgt explain`'s plots and `pgt serve`."""
