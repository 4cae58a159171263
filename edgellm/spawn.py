"""Starting helper processes (the engine core, the grammar compile workers) from any caller, and naming
how one ended."""

from __future__ import annotations

import signal
import sys
import types
from typing import Any


def describe_exit(what: str, code: int | None) -> str:
    """`what` ("the engine core process") and how it ended, from its exit code."""
    if code is None:
        return f"{what} stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{what} was killed by {name}"
    return f"{what} exited with status {code}"


def start_without_main(process: Any) -> None:
    """Start a spawn-context process without re-running the caller's __main__ in it: the child needs
    nothing from it, and a script without an `if __name__ == "__main__"` guard would start a second copy
    of itself from inside the child."""
    main, stderr = sys.modules["__main__"], sys.stderr
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__ or __spec__: nothing to re-run
    # The launcher passes sys.stderr's descriptor on; an app that captures output (Textual) replaces
    # sys.stderr with an object whose fileno() is not a descriptor.
    sys.stderr = sys.__stderr__ or stderr
    try:
        process.start()
    finally:
        sys.modules["__main__"], sys.stderr = main, stderr
