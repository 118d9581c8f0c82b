"""Zipped model packages: what such an archive may hold, where its package is, and unpacking it.

One rule for everyone who takes a package as a zip: the CLI and the server when a user uploads
one, the build worker and the doctor when they adopt it, the agent when it installs a build.

* every entry stays inside the extraction folder: no absolute path, no ``..``, no backslash, no
  drive letter, no symbolic link;
* exactly one package, found by its anchor file: a Core ML package's ``Manifest.json``
  (``<name>.mlpackage/Manifest.json``, or ``Manifest.json`` at the top, a zip of the package's
  contents); where the caller accepts Core AI too (the agent installing a build), a Core AI
  asset's program ``<name>.aimodel/main.mlirb`` (only as a folder: its name says its format);
* at most a given number of bytes once unpacked, when a limit is given;
* once unpacked, every item a Core ML manifest lists is under the package's ``Data/``.

Every refusal is an :class:`ArchiveError` whose message starts with the archive's name; the
callers turn it into their own error (a refused upload, a failed build, an unusable artifact).
Standard library only: the server and the agent import it.
"""

from __future__ import annotations

import json
import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MANIFEST = "Manifest.json"
WHERE = f"<name>.mlpackage/{MANIFEST}, or {MANIFEST} at the top"
# A Core AI asset is a folder named *.aimodel holding its program (decodebench.formats.coreai).
AIMODEL_SUFFIX = ".aimodel"
AIMODEL_PROGRAM = "main.mlirb"
COREML_ONLY = (".mlpackage",)
EVERY_FORMAT = (".mlpackage", AIMODEL_SUFFIX)


class ArchiveError(ValueError):
    """A zipped package is refused; the message names the archive and the entry at fault."""


@dataclass(frozen=True)
class PackageArchive:
    """What a checked archive holds: its package's anchor entry (a Core ML manifest, a Core AI
    program) and its unpacked size."""

    manifest: str
    unpacked_bytes: int

    @property
    def prefix(self) -> str:
        """The package's folder inside the archive ("" when its contents are at the top)."""
        parent = PurePosixPath(self.manifest).parent
        return str(parent) if parent.parts else ""


def is_manifest(member: PurePosixPath) -> bool:
    """Whether an entry is a package's manifest: at the top, or in a ``.mlpackage`` folder."""
    if member.name != MANIFEST:
        return False
    return len(member.parts) == 1 or (
        len(member.parts) == 2 and member.parts[0].endswith(".mlpackage")
    )


def is_anchor(member: PurePosixPath, suffixes: tuple[str, ...]) -> bool:
    """Whether an entry marks a package of an accepted format (``suffixes``)."""
    if ".mlpackage" in suffixes and is_manifest(member):
        return True
    return (
        AIMODEL_SUFFIX in suffixes
        and member.name == AIMODEL_PROGRAM
        and len(member.parts) == 2
        and member.parts[0].endswith(AIMODEL_SUFFIX)
    )


def _expected(suffixes: tuple[str, ...]) -> str:
    expected = f"a zipped .mlpackage ({WHERE})"
    if AIMODEL_SUFFIX in suffixes:
        folder = f"<name>{AIMODEL_SUFFIX}"
        expected += f" or a zipped {folder} folder ({folder}/{AIMODEL_PROGRAM})"
    return expected


def check_entry(entry: zipfile.ZipInfo, name: str) -> PurePosixPath:
    """The entry's path, refused when unpacking it could write outside the extraction folder."""
    path = entry.filename
    member = PurePosixPath(path)
    if (
        member.is_absolute()
        or ".." in member.parts
        or "\\" in path
        or (len(path) > 1 and path[1] == ":")
    ):
        raise ArchiveError(f"{name}: entry {path!r} escapes the package folder")
    if stat.S_ISLNK(entry.external_attr >> 16):
        raise ArchiveError(
            f"{name}: entry {path!r} is a symbolic link; a package holds only files and folders"
        )
    return member


def read_package_archive(
    path: Path,
    name: str,
    max_unpacked_bytes: int | None = None,
    suffixes: tuple[str, ...] = COREML_ONLY,
) -> PackageArchive:
    """Check a zipped package's entries (see the module) without unpacking it; ``suffixes``:
    the package formats accepted (Core ML only, unless the caller says otherwise)."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError) as error:
        raise ArchiveError(f"{name}: not a zip archive ({error})") from None
    unpacked = 0
    manifests: list[str] = []
    misplaced: list[str] = []
    for entry in entries:
        member = check_entry(entry, name)
        unpacked += entry.file_size
        if is_anchor(member, suffixes):
            manifests.append(entry.filename)
        elif member.name == MANIFEST or (
            AIMODEL_SUFFIX in suffixes and member.name == AIMODEL_PROGRAM
        ):
            misplaced.append(entry.filename)
    if max_unpacked_bytes is not None and unpacked > max_unpacked_bytes:
        raise ArchiveError(
            f"{name}: unpacks to {unpacked} bytes, over the limit of {max_unpacked_bytes} "
            "(DECODEBENCH_MAX_MODEL_BYTES)"
        )
    if not manifests:
        found = f" ({', '.join(sorted(misplaced))} is not where a package keeps it)"
        raise ArchiveError(
            f"{name}: contains no {MANIFEST}{found if misplaced else ''}: expected "
            f"{_expected(suffixes)}"
        )
    if len(manifests) > 1:
        raise ArchiveError(
            f"{name}: holds more than one package ({', '.join(sorted(manifests))}); expected "
            f"exactly one, {_expected(suffixes)}"
        )
    return PackageArchive(manifest=manifests[0], unpacked_bytes=unpacked)


def unpack_package(
    path: Path,
    destination: Path,
    name: str,
    max_unpacked_bytes: int | None = None,
    suffixes: tuple[str, ...] = COREML_ONLY,
) -> Path:
    """Check, unpack (into ``destination``, replaced whole) and check again a zipped package of
    an accepted format (``suffixes``); returns the package's folder. A damaged archive (a
    checksum that does not match) is refused before anything is written to ``destination``."""
    listing = read_package_archive(path, name, max_unpacked_bytes, suffixes)
    partial = destination.with_name(destination.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
            if damaged is not None:
                raise ArchiveError(f"{name} is damaged: checksum mismatch in {damaged}")
            archive.extractall(partial)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise ArchiveError(f"{name} is damaged: {error}") from None
    except ArchiveError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(destination, ignore_errors=True)
    partial.replace(destination)
    package = destination / listing.prefix if listing.prefix else destination
    if package.suffix != AIMODEL_SUFFIX:  # an asset's program was found where it belongs
        check_manifest(package)
    return package


def check_manifest(package: Path) -> None:
    """Every item the package's Manifest.json lists must exist under its Data/ directory."""
    try:
        manifest = json.loads((package / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArchiveError(f"{MANIFEST} of {package.name} is unreadable: {error}") from None
    if not isinstance(manifest, dict):
        raise ArchiveError(f"{MANIFEST} of {package.name} is not a JSON object")
    entries = manifest.get("itemInfoEntries", {})
    if not isinstance(entries, dict):
        raise ArchiveError(f"{MANIFEST} of {package.name}: itemInfoEntries is not an object")
    for identifier, entry in entries.items():
        item_path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(item_path, str) or not item_path:
            raise ArchiveError(f"{MANIFEST} of {package.name}: item {identifier} has no path")
        if not (package / "Data" / item_path).exists():
            raise ArchiveError(
                f"{MANIFEST} of {package.name} lists {item_path} but the package has no "
                f"Data/{item_path}"
            )
    root = manifest.get("rootModelIdentifier")
    if root is not None and root not in entries:
        raise ArchiveError(
            f"{MANIFEST} of {package.name}: rootModelIdentifier {root} is not among its items"
        )
