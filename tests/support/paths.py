"""Where the checkout and the tests' data files are, for tests that read files by path."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: tests/support/paths.py
DATA = ROOT / "tests" / "data"
