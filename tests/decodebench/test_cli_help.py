"""`decodebench <command> --help` describes that command, and the chatter of third-party imports
(coremltools' native proxies, its untested-torch notice) never reaches the user's terminal."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import ROOT

# A phrase of each command's own description (its module docstring), shown by its --help.
DESCRIPTIONS = {
    "build": "one variant, converted and analysed",
    "analyze": "what a saved build's graph moves per decoded token",
    "diff": "why one build should decode faster than another",
    "fold": "remove GQA KV replication from a program",
    "repair": "repair a program, proven on prompts",
    "doctor": "diagnose, repair and prove a Core ML LLM in one pass",
    "verify": "do two programs decode the same?",
    "model": "real checkpoints, locally and on a server",
    "submit": "run a sweep",
    "status": "a sweep's comparison table, and what the model answered",
    "schedule": "nightly sweeps on a server",
    "cure": "a doctor job on a server for an uploaded package",
}


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run("-m", "decodebench.cli", *args, **env)


@pytest.mark.parametrize("command", sorted(DESCRIPTIONS))
def test_each_command_help_describes_that_command(command: str) -> None:
    done = run_cli(command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: decodebench {command} "), done.stdout[:200]
    assert DESCRIPTIONS[command] in done.stdout, done.stdout
    others = [other for name, other in DESCRIPTIONS.items() if name != command]
    assert not [other for other in others if other in done.stdout]
    assert "build and analyse variants locally" not in done.stdout  # not the top-level text
    assert done.stderr == ""


def _import_noise() -> list[str]:
    """What importing torch and coremltools prints on this machine (empty where it is quiet)."""
    done = run("-c", "import torch, coremltools")
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stderr.splitlines() if line.strip()]


def test_third_party_import_noise_goes_to_debug_logging(tmp_path: Path) -> None:
    from decodebench._quiet import NOISE

    # torch's own log lines carry a "W1207 05:37:28.488000 5631 file.py:630] " head.
    noise = [re.sub(r"^[DIWE]\d{4} [\d:.]+ \d+ \S+\] ", "", line) for line in _import_noise()]
    assert all(NOISE.search(line) for line in noise), noise
    missing = str(tmp_path / "nope.mlpackage")

    helped = run_cli("analyze", "--help")
    assert helped.returncode == 0 and helped.stderr == ""

    analyzed = run_cli("analyze", missing)  # imports coremltools before reading the path
    assert analyzed.returncode == 2
    assert analyzed.stderr.strip().splitlines() == [
        f"decodebench: error: {missing} is not an .mlpackage: the path does not exist"
    ]
    for text in ("Failed to load _MLModelProxy", "has not been tested with coremltools"):
        assert text not in analyzed.stderr

    for debug in (run_cli("-v", "analyze", missing), run_cli("analyze", missing, DECODEBENCH_LOG="debug")):  # fmt: skip
        assert debug.returncode == 2
        shown = {
            line.split(": ", 1)[1]
            for line in debug.stderr.splitlines()
            if line.startswith("DEBUG ") and ": " in line
        }
        # torch's own Enum notice is logged before the CLI configures logging: only demoted.
        expected = {line for line in noise if "Enum subclass" not in line}
        assert expected <= shown, debug.stderr[-2000:]


@pytest.fixture
def coremltools_logger() -> Iterator[logging.Logger]:
    """coremltools' logger as a fresh process has it: a CLI command run earlier in this process
    may have quietened it to ERROR."""
    logger = logging.getLogger("coremltools")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.NOTSET)
    logger.propagate = True
    yield logger
    logger.setLevel(level)
    logger.propagate = propagate


def test_only_the_import_noise_is_demoted(
    caplog: pytest.LogCaptureFixture, coremltools_logger: logging.Logger
) -> None:
    import warnings

    from decodebench import _quiet

    _quiet.route_import_noise()
    _quiet.route_import_noise()  # idempotent: one filter, one hook
    coremltools = coremltools_logger
    assert coremltools.filters.count(_quiet._FILTER) == 1
    caplog.set_level(logging.INFO)
    coremltools.warning("Failed to load _MLModelProxy: No module named 'x'")
    coremltools.warning("a real warning")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "a real warning")
    ]

    caplog.clear()
    caplog.set_level(logging.DEBUG)
    coremltools.warning("Torch version 9.9 has not been tested with coremltools. You may ...")
    assert [r.levelname for r in caplog.records] == ["DEBUG"]

    caplog.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _quiet._show_warning  # catch_warnings restores the hook it saw
        warnings.warn("torch 9.9 has not been tested with coremltools", stacklevel=1)
    assert [r.name for r in caplog.records] == ["decodebench._quiet"]
