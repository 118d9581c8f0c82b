"""Build artifacts on the agent host: a content-addressed download cache and .mlpackage unpacking.

An artifact is a zip of one `.mlpackage` directory (`<name>.mlpackage/Manifest.json`,
`<name>.mlpackage/Data/…`); a zip of the package's contents (`Manifest.json` at the top) is
accepted too.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from agent.drivers.base import ArtifactError
from decodebench.client import file_sha256

log = logging.getLogger(__name__)

SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
MANIFEST = "Manifest.json"


class ArtifactCache:
    """`<root>/<sha256>.zip`; each artifact is downloaded once, even by concurrent device threads."""

    def __init__(self, root: Path, download: Callable[[str, Path], Path]) -> None:
        self.root = root
        self._download = download
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._verified: set[str] = set()

    def path_for(self, sha256: str) -> Path:
        if not SHA256_PATTERN.match(sha256):
            raise ArtifactError(f"artifact address {sha256!r} is not a lowercase sha256 hex digest")
        return self.root / f"{sha256}.zip"

    def fetch(self, sha256: str) -> Path:
        """The local path of the artifact, downloading it (checked against its digest) if absent."""
        path = self.path_for(sha256)
        with self._lock_for(sha256):
            if path.exists() and self._is_intact(sha256, path):
                log.debug("artifact %s found in cache", sha256[:12])
                return path
            self.root.mkdir(parents=True, exist_ok=True)
            log.info("downloading artifact %s", sha256[:12])
            self._download(sha256, path)
            self._verified.add(sha256)
            return path

    def _lock_for(self, sha256: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(sha256, threading.Lock())

    def _is_intact(self, sha256: str, path: Path) -> bool:
        # A file written by an earlier agent process is re-hashed once: disks and people edit files.
        if sha256 in self._verified:
            return True
        if file_sha256(path) == sha256:
            self._verified.add(sha256)
            return True
        log.warning("cached artifact %s does not match its digest; downloading again", path)
        path.unlink()
        return False


def unpack_mlpackage(artifact_path: Path, destination: Path) -> Path:
    """Unpack and check a zipped .mlpackage into `destination`; return the package directory.

    Raises `ArtifactError` with the reason when the file is not a zip, is damaged, holds no
    (or more than one) Manifest.json, tries to write outside `destination`, or its manifest
    names items the package does not contain.
    """
    if not zipfile.is_zipfile(artifact_path):
        size = artifact_path.stat().st_size if artifact_path.exists() else 0
        raise ArtifactError(f"artifact {artifact_path.name} is not a zip archive ({size} bytes)")
    partial = destination.with_name(destination.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with zipfile.ZipFile(artifact_path) as archive:
            package_prefix = _package_prefix(archive, artifact_path.name)
            damaged = archive.testzip()
            if damaged is not None:
                raise ArtifactError(
                    f"artifact {artifact_path.name} is damaged: checksum mismatch in {damaged}"
                )
            archive.extractall(partial)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise ArtifactError(f"artifact {artifact_path.name} is damaged: {error}") from error
    except ArtifactError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(destination, ignore_errors=True)
    partial.replace(destination)
    package = destination / package_prefix if package_prefix else destination
    check_manifest(package)
    return package


def _package_prefix(archive: zipfile.ZipFile, artifact_name: str) -> str:
    manifests: list[PurePosixPath] = []
    for name in archive.namelist():
        member = PurePosixPath(name)
        if member.is_absolute() or ".." in member.parts or "\\" in name:
            raise ArtifactError(f"artifact {artifact_name} has an unsafe member path {name!r}")
        if member.name == MANIFEST and len(member.parts) <= 2:
            manifests.append(member)
    if not manifests:
        raise ArtifactError(
            f"artifact {artifact_name} contains no {MANIFEST}: expected a zipped .mlpackage "
            f"(<name>.mlpackage/{MANIFEST}, <name>.mlpackage/Data/…)"
        )
    if len(manifests) > 1:
        found = ", ".join(sorted(str(manifest) for manifest in manifests))
        raise ArtifactError(f"artifact {artifact_name} holds more than one package ({found})")
    return str(manifests[0].parent) if manifests[0].parent.parts else ""


def check_manifest(package: Path) -> None:
    """Every item the package's Manifest.json lists must exist under its Data/ directory."""
    try:
        manifest = json.loads((package / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArtifactError(f"{MANIFEST} of {package.name} is unreadable: {error}") from error
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{MANIFEST} of {package.name} is not a JSON object")
    entries = manifest.get("itemInfoEntries", {})
    if not isinstance(entries, dict):
        raise ArtifactError(f"{MANIFEST} of {package.name}: itemInfoEntries is not an object")
    for identifier, entry in entries.items():
        item_path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(item_path, str) or not item_path:
            raise ArtifactError(f"{MANIFEST} of {package.name}: item {identifier} has no path")
        if not (package / "Data" / item_path).exists():
            raise ArtifactError(
                f"{MANIFEST} of {package.name} lists {item_path} but the package has no "
                f"Data/{item_path}"
            )
    root = manifest.get("rootModelIdentifier")
    if root is not None and root not in entries:
        raise ArtifactError(
            f"{MANIFEST} of {package.name}: rootModelIdentifier {root} is not among its items"
        )


def directory_bytes(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


class PackageCache:
    """Unpacked, checked packages by artifact address: `<root>/<sha256>/…`, each unpacked once."""

    MARKER = ".package"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def unpacked(self, sha256: str, artifact_path: Path) -> Path:
        destination = self.root / sha256
        with self._locks_guard:
            lock = self._locks.setdefault(sha256, threading.Lock())
        with lock:
            marker = destination / self.MARKER
            if marker.is_file():
                package = destination / marker.read_text()
                if (package / MANIFEST).is_file():
                    return package
            self.root.mkdir(parents=True, exist_ok=True)
            package = unpack_mlpackage(artifact_path, destination)
            marker.write_text(package.relative_to(destination).as_posix())
            return package
