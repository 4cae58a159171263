"""Sampling: the request's parameters and the per-request sampler over a logits row (sampler.py),
the sort-free top-p / min-p kernels (nucleus.py), server-wide defaults (defaults.py). Imports
nothing of the engine core, the server or the TUI."""
