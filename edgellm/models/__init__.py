"""Where model files come from: the catalog of short names (catalog.py), the Hugging Face Hub
(hub.py), and what both share (files.py). Imports nothing of the engine core, the server or the TUI."""
