"""The Pointer Generator Transformer: the model and its variants, its inference form, the extended vocabulary,
checkpoints."""
