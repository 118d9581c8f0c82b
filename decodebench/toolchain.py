"""The toolchain identity: which versions make an artifact, spelled one way everywhere.

A build is keyed by (model, variant, toolchain). The server keys builds by the toolchain its
settings name; a worker builds only when its installed toolchain has the same releases. Local
version labels (``2.13.0+cpu``) name how a wheel was built, not what it computes, so they are
dropped: the worker's own key then equals the server's.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

TOOLCHAIN_PACKAGES = ("decodebench", "torch", "coremltools")


class ToolchainMismatch(ValueError):
    """This toolchain is not the one a build is keyed by."""


def release(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``."""
    return version.split("+", 1)[0]


def _installed(package: str) -> str:
    try:
        return release(metadata.version(package))
    except metadata.PackageNotFoundError:
        return "absent"


def installed_toolchain() -> dict[str, str]:
    """The installed versions, read from package metadata (nothing heavy is imported)."""
    return {package: _installed(package) for package in TOOLCHAIN_PACKAGES}


def toolchain_identity(versions: Mapping[str, str]) -> dict[str, str]:
    """Any spelling of a toolchain (``torch.__version__`` and the like) in its canonical form."""
    return {package: release(version) for package, version in versions.items()}


def check_toolchain(expected: Mapping[str, str], actual: Mapping[str, str]) -> None:
    """Refuse to build an artifact keyed by another toolchain: it would be mislabelled."""
    for package, version in expected.items():
        have = actual.get(package, "absent")
        if release(have) != release(version):
            raise ToolchainMismatch(f"build expects {package} {version}, this host has {have}")
