"""Build artifacts travel as one deterministic zip: the same files always give the same bytes.

Unpacking one (and what a zipped package may hold) is :mod:`decodebench.archives`'s."""

from __future__ import annotations

import zipfile
from pathlib import Path

# Fixed timestamp so a rebuild of identical files has an identical content address.
_EPOCH = (1980, 1, 1, 0, 0, 0)


class ArtifactError(Exception):
    pass


def pack_directory(source: Path, destination: Path) -> Path:
    """Zip every file below `source` (sorted, fixed times and modes) into `destination`."""
    files = sorted(path for path in source.rglob("*") if path.is_file())
    if not files:
        raise ArtifactError(f"{source} has no files to pack")
    with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            info = zipfile.ZipInfo(path.relative_to(source).as_posix(), date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with path.open("rb") as stream, archive.open(info, "w") as out:
                while chunk := stream.read(1 << 20):
                    out.write(chunk)
    return destination
