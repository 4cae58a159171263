"""Every architecture edgellm runs, found by file: each module of edgellm/arch/ that declares a `SPEC`
(arch/spec.py ArchSpec) and its `MODEL` (the forward class) is one architecture, so adding an architecture is
adding its file. gguf/ reads the specs from here; the engine core builds `MODEL`s (arch/__init__.py).

The modules are imported on the first look-up, not when this one is: a front-end that never opens a model
file loads none of them. They import no backend (tests/test_layering.py), so reading a file's config in a
front-end loads no kernel either.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgellm.arch.spec import ArchSpec


@cache
def _arch_modules() -> dict[str, ModuleType]:
    """Architecture name -> its module, in file-name order."""
    out: dict[str, ModuleType] = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem.startswith("_"):  # __init__.py: the package itself, not a module of it
            continue
        module = importlib.import_module(f"{__package__}.{path.stem}")
        spec = getattr(module, "SPEC", None)
        if spec is None:  # a shared module (common.py, moe.py, spec.py, ...)
            continue
        if spec.name in out:
            raise RuntimeError(
                f"architecture {spec.name!r} declared twice: {out[spec.name].__name__}, {module.__name__}"
            )
        out[spec.name] = module
    return out


def supported_architectures() -> tuple[str, ...]:
    return tuple(_arch_modules())


def arch_spec(arch: str) -> ArchSpec | None:
    """The spec of architecture `arch` (general.architecture), None when edgellm does not implement it."""
    module = _arch_modules().get(arch)
    return None if module is None else module.SPEC


def model_classes() -> dict[str, type]:
    """Architecture name -> the class whose (cfg, gguf, backend, progress) builds the model."""
    return {name: module.MODEL for name, module in _arch_modules().items()}


def missing_features(arch: str, tensor_roles: Iterable[str], key_suffixes: Iterable[str]) -> list[str]:
    """What a file of `arch` that edgellm does not implement needs (arch/unsupported.py)."""
    from edgellm.arch import unsupported

    return unsupported.features_in_file(arch, tensor_roles, key_suffixes)


def tensor_feature(role: str) -> str | None:
    """The unimplemented feature a tensor of this role carries (arch/unsupported.py), None if unknown."""
    from edgellm.arch import unsupported

    return unsupported.tensor_feature(role)


def key_feature(suffix: str) -> str | None:
    """The unimplemented feature an {arch}.<suffix> key selects (arch/unsupported.py), None if unknown."""
    from edgellm.arch import unsupported

    return unsupported.key_feature(suffix)
