"""Build artifacts on the agent host: a content-addressed download cache and package unpacking.

An artifact is a zip of one `.mlpackage` directory (`<name>.mlpackage/Manifest.json`,
`<name>.mlpackage/Data/…`); a zip of the package's contents (`Manifest.json` at the top) is
accepted too. A Core AI build's artifact is a zip of one `<name>.aimodel` folder (its program
`main.mlirb` beside its metadata), with the build's report beside it as for Core ML.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path

from agent.drivers.base import ArtifactError
from decodebench.archives import (
    AIMODEL_PROGRAM,
    EVERY_FORMAT,
    MANIFEST,
    ArchiveError,
    unpack_package,
)
from decodebench.client import file_sha256

log = logging.getLogger(__name__)

SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")


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
    """Unpack and check a zipped package (.mlpackage or .aimodel) into `destination`; return the
    package directory.

    Raises `ArtifactError` with the reason when the file is not a zip, is damaged, holds no
    (or more than one) package, tries to write outside `destination`, or its manifest names
    items the package does not contain (the rule of :mod:`decodebench.archives`).
    """
    try:
        name = f"artifact {artifact_path.name}"
        return unpack_package(artifact_path, destination, name, suffixes=EVERY_FORMAT)
    except ArchiveError as error:
        raise ArtifactError(str(error)) from None


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
                if (package / MANIFEST).is_file() or (package / AIMODEL_PROGRAM).is_file():
                    return package
            self.root.mkdir(parents=True, exist_ok=True)
            package = unpack_mlpackage(artifact_path, destination)
            marker.write_text(package.relative_to(destination).as_posix())
            return package
