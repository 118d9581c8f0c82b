"""The README's main job: the demo sweep end to end on embedded defaults (no system services)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def test_demo_prints_the_comparison_and_the_ui_address(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("DECODEBENCH_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.demo",
            "--var-dir",
            str(tmp_path / "demo"),
            "--timeout",
            "600",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    rows = [line for line in lines if line.startswith("iphone-")]
    assert len(rows) == 4
    assert all(line.endswith("SIMULATED") for line in rows)
    folded = [line for line in rows if "folded" in line]
    assert all(" 0 " in line for line in folded)  # no tile ops once the query heads are folded
    assert any(line.startswith("web UI: http://127.0.0.1:") for line in lines)
    assert "sweep 1 · tiny-gqa · completed" in result.stdout
