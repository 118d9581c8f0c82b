"""The toolchain identity: which versions make an artifact, spelled one way everywhere.

A build is keyed by (model, variant, toolchain). The server keys builds by the toolchain its
settings name; a worker builds only when its installed toolchain has the same releases. Local
version labels (``2.13.0+cpu``) name how a wheel was built, not what it computes, so they are
dropped: the worker's own key then equals the server's.

The identity also carries ``code``: a fingerprint of this repository's own source files that
shape a package or its build.json (the decoder, conversion, quantization, analysis, the report's
contracts). A version number does not move with every change of the converter, so without it a
graph change would be served the old cached package. Both roles compute it from their own
installed sources; a worker whose code differs from the server's refuses the build by name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import lru_cache
from importlib import metadata
from pathlib import Path

TOOLCHAIN_PACKAGES = ("decodebench", "torch", "coremltools")
CODE_KEY = "code"
# The modules (files, or packages taken whole) whose source makes a package and its report:
# every format's folder is in; the doctor is not (it rewrites packages in its own jobs, never a
# build), so editing the doctor does not throw away the build cache.
BUILDING_CODE = (
    "building",
    "modeling",
    "analysis",
    "formats",
    "contracts/build.py",
    "contracts/analysis.py",
    "contracts/domain.py",
    "contracts/presets.py",
    "contracts/recipes.py",
)
PACKAGE_ROOT = Path(__file__).resolve().parent


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


def code_fingerprint(root: Path = PACKAGE_ROOT, modules: tuple[str, ...] = BUILDING_CODE) -> str:
    """sha256 (first 16 hex digits) over the building modules' source files under ``root``:
    each file's path relative to ``root`` and its bytes, in path order. Files are read, not
    imported, so the server computes it without torch or coremltools."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for module in modules:
        path = root / module
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    for path in sorted(files, key=lambda file: file.relative_to(root).as_posix()):
        if not path.is_file():
            raise FileNotFoundError(f"building module {path} is missing")
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def installed_code() -> str:
    """This installation's code fingerprint (computed once per process)."""
    return code_fingerprint()


# A format's own toolchain beside torch (Core ML's is TOOLCHAIN_PACKAGES, unchanged).
FORMAT_TOOLCHAINS = {
    "coreai": ("decodebench", "torch", "coreai-core", "coreai-torch", "coreai-opt")
}


def installed_toolchain(format_name: str = "coreml") -> dict[str, str]:
    """The installed versions that key a build in ``format_name``, read from package metadata
    (nothing heavy is imported), and the fingerprint of the building code."""
    packages = FORMAT_TOOLCHAINS.get(format_name, TOOLCHAIN_PACKAGES)
    versions = {package: _installed(package) for package in packages}
    return {**versions, CODE_KEY: installed_code()}


def format_toolchain(toolchain: Mapping[str, str], format_name: str = "coreml") -> dict[str, str]:
    """What of a toolchain naming every format's packages keys a build in ``format_name``: that
    format's packages and the code fingerprint (a Core ML build keeps exactly the key it had
    before Core AI's packages were named beside its own)."""
    packages = (*FORMAT_TOOLCHAINS.get(format_name, TOOLCHAIN_PACKAGES), CODE_KEY)
    return {package: toolchain[package] for package in packages if package in toolchain}


def toolchain_identity(versions: Mapping[str, str]) -> dict[str, str]:
    """Any spelling of a toolchain (``torch.__version__`` and the like) in its canonical form."""
    return {package: release(version) for package, version in versions.items()}


def check_toolchain(expected: Mapping[str, str], actual: Mapping[str, str]) -> None:
    """Refuse to build an artifact keyed by another toolchain: it would be mislabelled."""
    for package, version in expected.items():
        have = actual.get(package, "absent")
        if release(have) != release(version):
            raise ToolchainMismatch(f"build expects {package} {version}, this host has {have}")
