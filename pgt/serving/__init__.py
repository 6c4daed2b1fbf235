"""A trained model at work: the logged pyfunc and the doors that log and load it, inference, `pgt predict`,
`pgt evaluate`, `pgt explain`'s plots and `pgt serve`."""
