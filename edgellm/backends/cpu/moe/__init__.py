"""Mixture-of-experts layers on the CPU: the router's top-k (route.py), the
experts' matmuls (experts.py) and the block that joins them (block.py)."""
