"""LoRA adapters applied without merging, per request (llama.cpp's `--lora` GGUF files).

adapter.py: loading a GGUF adapter and binding it to the base model (every check a mismatch fails); apply.py:
the low-rank updates of one forward step, the batch's rows grouped by the adapters each request uses;
choice.py: which adapters (and scales) a request runs with, as llama-server resolves them (light: the
front-ends import it without numpy work or a backend).
"""
