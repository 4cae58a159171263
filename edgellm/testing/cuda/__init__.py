"""Helpers of the CUDA tests: a forward on the simulator, guards, profiles."""
