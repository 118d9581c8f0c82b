"""The ``decodebench`` command line in a process of its own, as a user runs it."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "decodebench.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
