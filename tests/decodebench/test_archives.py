"""The one rule for a zipped model package (decodebench.archives), as the server, the build
worker and the agent apply it: every hostile archive refused with a reason naming the entry."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest

from agent.artifacts import unpack_mlpackage
from agent.drivers.base import ArtifactError
from decodebench.archives import ArchiveError, read_package_archive, unpack_package
from decodebench.building.job import BuildError
from decodebench.building.package import package_from_zip
from decodebench.modelfiles import ModelFileError, check_package_zip

MANIFEST = b'{"itemInfoEntries": {}}'
GOOD = {"m.mlpackage/Manifest.json": MANIFEST, "m.mlpackage/Data/w.bin": b"0" * 100}


def _zip(path: Path, entries: dict[str, bytes], symlinks: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        for name in symlinks:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "../../../etc/passwd")
    return path


HOSTILE = [
    ({**GOOD, "../evil": b"x"}, (), r"entry '\.\./evil' escapes the package folder"),
    ({**GOOD, "m.mlpackage/../../evil": b"x"}, (), "escapes the package folder"),
    ({**GOOD, "m.mlpackage\\..\\evil": b"x"}, (), "escapes the package folder"),
    ({**GOOD, "/etc/evil": b"x"}, (), r"entry '/etc/evil' escapes the package folder"),
    ({**GOOD, "C:/evil": b"x"}, (), "escapes the package folder"),
    (GOOD, ("m.mlpackage/Data/link",), r"entry 'm\.mlpackage/Data/link' is a symbolic link"),
    (
        {"a/m.mlpackage/Manifest.json": MANIFEST},
        (),
        r"contains no Manifest\.json \(a/m\.mlpackage/Manifest\.json is not where a package",
    ),
    ({"folder/Manifest.json": MANIFEST}, (), "folder/Manifest.json is not where a package"),
    ({"m.mlpackage/Data/w.bin": b"0"}, (), r"contains no Manifest\.json: expected"),
    (
        {**GOOD, "n.mlpackage/Manifest.json": MANIFEST},
        (),
        "holds more than one package .*; expected exactly one",
    ),
]


@pytest.mark.parametrize(("entries", "symlinks", "reason"), HOSTILE)
def test_a_hostile_archive_is_refused_by_every_taker_with_the_same_reason(
    tmp_path: Path, entries: dict[str, bytes], symlinks: tuple[str, ...], reason: str
) -> None:
    path = _zip(tmp_path / "p.zip", entries, symlinks)

    with pytest.raises(ArchiveError, match=reason):
        read_package_archive(path, "p.zip")
    with pytest.raises(ModelFileError, match=f"p.zip: .*{reason}"):
        check_package_zip(path, "p.zip", 10_000)
    with pytest.raises(BuildError, match=reason):
        package_from_zip(path, tmp_path / "built")
    with pytest.raises(ArtifactError, match=f"artifact p.zip: .*{reason}"):
        unpack_mlpackage(path, tmp_path / "installed")
    assert sorted(item.name for item in tmp_path.iterdir()) == ["p.zip"]


def test_the_size_limit_counts_unpacked_bytes(tmp_path: Path) -> None:
    path = _zip(tmp_path / "p.zip", GOOD)

    assert read_package_archive(path, "p.zip", 1_000).unpacked_bytes == len(MANIFEST) + 100
    with pytest.raises(ArchiveError, match="unpacks to .* over the limit of 50"):
        unpack_package(path, tmp_path / "out", "p.zip", max_unpacked_bytes=50)


def test_a_package_at_the_top_or_in_its_folder_unpacks_to_its_folder(tmp_path: Path) -> None:
    nested = _zip(tmp_path / "nested.zip", GOOD)
    flat = _zip(tmp_path / "flat.zip", {"Manifest.json": MANIFEST, "Data/w.bin": b"0"})

    assert unpack_package(nested, tmp_path / "a", "nested.zip") == tmp_path / "a" / "m.mlpackage"
    assert unpack_package(flat, tmp_path / "b", "flat.zip") == tmp_path / "b"
    assert package_from_zip(flat, tmp_path / "c") == tmp_path / "c.mlpackage"
    assert (tmp_path / "c.mlpackage" / "Data" / "w.bin").is_file()


AIMODEL = {"model.aimodel/main.mlirb": b"ML\xefR", "model.aimodel/metadata.json": b"{}"}


def test_the_agent_takes_a_core_ai_asset_folder_and_an_upload_does_not(tmp_path: Path) -> None:
    path = _zip(tmp_path / "a.zip", {**AIMODEL, "build.json": b"{}"})

    package = unpack_mlpackage(path, tmp_path / "installed")

    assert package == tmp_path / "installed" / "model.aimodel"
    assert (package / "main.mlirb").read_bytes() == b"ML\xefR"
    with pytest.raises(ModelFileError, match=r"contains no Manifest\.json: expected a zipped "):
        check_package_zip(path, "a.zip", 10_000)


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ({"main.mlirb": b"x"}, r"contains no Manifest\.json \(main\.mlirb is not where"),
        ({"a/model.aimodel/main.mlirb": b"x"}, r"contains no Manifest\.json \(a/model"),
        ({**AIMODEL, **GOOD}, "holds more than one package"),
    ],
)
def test_a_core_ai_asset_is_found_only_as_its_own_folder(
    tmp_path: Path, entries: dict[str, bytes], reason: str
) -> None:
    with pytest.raises(ArtifactError, match=f"artifact a.zip: {reason}.*<name>.aimodel/main"):
        unpack_mlpackage(_zip(tmp_path / "a.zip", entries), tmp_path / "installed")
