"""Tiny synthetic GGUF models (random weights) laid out as llama.cpp's converters
lay them out: write_tiny_model (models.py), their metadata and tensor shapes."""
