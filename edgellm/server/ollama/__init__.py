"""Ollama's native API (/api/*) on the shared front-end."""
