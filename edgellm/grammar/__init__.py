"""Constrained decoding's grammars on llguidance: cheap checks on a source (limits.py), compiled
in worker processes (worker.py, native.py), asked for by the front-ends (compile.py). Imports
nothing of the engine core, the server or the TUI."""
