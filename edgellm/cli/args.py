"""Argument types shared by the CLI's parser and the launchers it hands parsed values to (which check
values given from Python the same way); importing this loads nothing of the server or the engine."""

from __future__ import annotations

import argparse


def replicas_arg(text: str) -> int | str:
    """`--replicas`: a count >= 1, or "auto" (Ray Serve autoscaling on queue length)."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a replica count >= 1 nor 'auto'")
    return n
