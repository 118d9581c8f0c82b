"""Builds as a service: the build key of a request, and a content-addressed store of artifacts.

Everything here is light (no torch, no coremltools import): a cache hit answers in well under a
second. The key hashes (model identity, variant graph identity, toolchain versions); the model
identity is the preset name, or ``<name>@sha256:<fingerprint>`` for a weights folder.

The store also keeps measured sensitivity rankings (``<root>/sensitivity/<key>.json``): a
ranking depends on the model and how it was measured, not on context, attention layout or KV, so
every later variant of a model reuses its first build's measurement.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import PACKAGE_NAME, REPORT_NAME
from decodebench.contracts.variants import build_key

CACHE_ENV = "DECODEBENCH_BUILD_CACHE"


def model_identity(model: str, weights_fingerprint: str | None = None) -> str:
    return model if weights_fingerprint is None else f"{model}@sha256:{weights_fingerprint}"


def request_key(identity: str, variant: VariantSpec, toolchain: dict[str, str]) -> str:
    return build_key(identity, variant, toolchain)


def ranking_key(identity: str, measurement: dict[str, Any]) -> str:
    """Content address of a sensitivity ranking: the model identity and everything that shapes
    the measurement (model config, schemes tried, calibration, arithmetic, toolchain)."""
    canonical = json.dumps(
        {"model": identity, "measurement": measurement}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def default_cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "decodebench" / "builds"


def read_report(out_dir: Path) -> BuildReport | None:
    """The build.json of a complete build in ``out_dir`` (package present), else None.

    A report this version cannot read counts as absent: the build is simply made again.
    """
    report_path = out_dir / REPORT_NAME
    if not report_path.is_file():
        return None
    try:
        report = BuildReport.model_validate_json(report_path.read_bytes())
    except ValidationError:
        return None
    return report if _package_complete(out_dir / report.package) else None


def _package_complete(package: Path) -> bool:
    """A Core ML package has its manifest; a Core AI asset its program (and its hash)."""
    if package.suffix == ".aimodel":
        return (package / "main.mlirb").is_file() and (package / "main.hash").is_file()
    return package.name == PACKAGE_NAME and (package / "Manifest.json").is_file()


def find_build(out_dir: Path, key: str, cache: BuildCache | None) -> BuildReport | None:
    """The build ``key`` if ``out_dir`` holds it already or ``cache`` can restore it there."""
    existing = read_report(out_dir)
    if existing is not None and existing.key == key:
        return existing
    return cache.restore(key, out_dir) if cache is not None else None


class BuildCache:
    """``<root>/<key>/{model.mlpackage, build.json}``; entries are complete or absent."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_cache_root()

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str) -> BuildReport | None:
        report = read_report(self.entry(key))
        return report if report is not None and report.key == key else None

    def store(self, key: str, out_dir: Path) -> None:
        """Add a finished build (hard links where possible: no second copy of the weights)."""
        entry = self.entry(key)
        if self.lookup(key) is not None:
            return
        staging = entry.with_name(f".{key}.{os.getpid()}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        package = _package_of(out_dir)
        _link_tree(out_dir / package, staging / package)
        shutil.copy2(out_dir / REPORT_NAME, staging / REPORT_NAME)
        entry.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(entry, ignore_errors=True)
        try:
            os.replace(staging, entry)
        except OSError:
            # Another process stored the same key between our check and here: theirs stands.
            shutil.rmtree(staging, ignore_errors=True)
            if self.lookup(key) is None:
                raise

    def ranking(self, key: str) -> dict[str, Any] | None:
        """A stored sensitivity ranking (raw JSON object), or None."""
        try:
            stored = json.loads((self.root / "sensitivity" / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return stored if isinstance(stored, dict) else None

    def store_ranking(self, key: str, ranking: dict[str, Any]) -> None:
        path = self.root / "sensitivity" / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(ranking, indent=2))
        os.replace(partial, path)

    def restore(self, key: str, out_dir: Path) -> BuildReport | None:
        """Materialize a cached build into ``out_dir``; its report, or None on a miss."""
        report = self.lookup(key)
        if report is None:
            return None
        existing = read_report(out_dir)
        if existing is not None and existing.key == key:
            return existing
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = out_dir / f".restoring-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        package = report.package
        _link_tree(self.entry(key) / package, staging / package)
        (out_dir / REPORT_NAME).unlink(missing_ok=True)
        target = out_dir / package
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging / package, target)
        staging.rmdir()
        shutil.copy2(self.entry(key) / REPORT_NAME, out_dir / REPORT_NAME)
        return report


def _package_of(out_dir: Path) -> str:
    """The package a finished build in ``out_dir`` holds, as its report names it."""
    try:
        return str(json.loads((out_dir / REPORT_NAME).read_text()).get("package") or PACKAGE_NAME)
    except (OSError, ValueError):
        return PACKAGE_NAME


def _link_tree(source: Path, target: Path) -> None:
    for path in sorted(source.rglob("*")):
        destination = target / path.relative_to(source)
        if path.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, destination)
        except OSError:
            shutil.copy2(path, destination)
