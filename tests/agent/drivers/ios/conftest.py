"""The emulated fleet, drivers on it, and real tiny-gqa builds (converted once a session)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.drivers.emulated import EmulatedDriver, driver_for_fleet
from decodebench.artifacts import pack_directory
from decodebench.contracts.domain import VariantSpec
from emulator.fleet import EmulatedFleet
from tests.support.emulated import CONTEXT, Build


@pytest.fixture(scope="session")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    """Real tiny-gqa builds (coremltools), both attention layouts, zipped as the worker does."""
    from decodebench.building.build import build_variant

    root = tmp_path_factory.mktemp("builds")
    built = {}
    for attention in ("repeat_kv", "folded"):
        variant = VariantSpec(attention=attention, context=CONTEXT)
        out = root / attention
        report = build_variant("tiny-gqa", variant, out)
        archive = pack_directory(out, root / f"{attention}.zip")
        sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
        built[attention] = Build(
            variant,
            archive.rename(root / f"{sha256}.zip"),
            out / "model.mlpackage",
            report.analysis.bytes_per_token.total,
        )
    return built


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[EmulatedFleet]:
    running = EmulatedFleet(tmp_path / "devices", tokens="off", reattach_after_s=None)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def make_driver(fleet: EmulatedFleet, tmp_path: Path) -> Iterator[Callable[..., EmulatedDriver]]:
    drivers: list[EmulatedDriver] = []

    def make(**options: object) -> EmulatedDriver:
        driver = driver_for_fleet(
            fleet, tmp_path / "agent", poll_interval_s=0.02, owns_fleet=False, **options
        )
        drivers.append(driver)
        return driver

    yield make
    for driver in drivers:
        driver.close()
