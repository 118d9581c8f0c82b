"""The artifact the simulated driver's tests run: a real zip of an .mlpackage directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.simulated import content_addressed, write_package, zip_directory


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    package = write_package(tmp_path / "build")
    return content_addressed(zip_directory(package, tmp_path / "artifact.zip"))
