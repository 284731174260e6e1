"""A real pretrained causal LM behind ART's Backend protocol, on CUDA when present and the CPU otherwise."""
