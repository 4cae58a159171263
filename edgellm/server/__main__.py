"""`python -m edgellm.server [MODEL] [--host] [--port] ...`: `edgellm serve`, the same parser and command."""

from __future__ import annotations

import argparse
import sys

from edgellm.cli import commands as cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m edgellm.server", description="OpenAI-compatible server")
    cli.add_serve_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, build_parser())


if __name__ == "__main__":
    sys.exit(main())
