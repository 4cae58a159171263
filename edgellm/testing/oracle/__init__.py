"""The oracle cases: each architecture's tiny model checked against llama.cpp's
logits (case.py, cases.py, families.py), and llama-cpp-python where it runs (llamacpp.py)."""
