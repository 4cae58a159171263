"""Numba's compile target for a forced CPU tier (EDGELLM_CPU_TIER) or an ARM64 host, set when Numba is
first imported.

Numba reads its target (NUMBA_CPU_NAME, NUMBA_CPU_FEATURES) once, when it is imported, so the variables
must be set before that; computing them needs llvmlite (the host's features as LLVM names them). An import
hook does it at the moment Numba is first imported: the engine core gets the target, and a front-end
(LLM, the server, the TUI), which never imports Numba, never loads llvmlite for it.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


def _apply() -> None:
    from edgellm.backends.cpu.tiers import apply_numba_target

    apply_numba_target(os.environ)


class NumbaTargetHook(importlib.abc.MetaPathFinder):
    """Sets the target when `numba` is first imported, then leaves the import to the usual finders."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == "numba" and self in sys.meta_path:
            sys.meta_path.remove(self)
            _apply()
        return None


def install() -> None:
    """Set the target now if Numba is already imported (too late to take effect: the CPU backend reports
    a tier its code was not compiled for), else when it is."""
    if "numba" in sys.modules:
        _apply()
    elif not any(isinstance(f, NumbaTargetHook) for f in sys.meta_path):
        sys.meta_path.insert(0, NumbaTargetHook())
