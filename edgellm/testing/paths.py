"""Where the checkout's folders are, for tests and scripts at any depth below it (a test file moved into a
subfolder keeps finding its fixtures)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
ORACLE_FIXTURES = FIXTURES / "oracle"
SCRIPTS = ROOT / "scripts"
