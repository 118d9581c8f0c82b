"""Artifacts run on the simulated driver: what is accepted, every damaged or unsafe artifact
refused with its reason, and the agent's artifact cache."""

from __future__ import annotations

import threading
import time
import zipfile
from pathlib import Path

import pytest

from agent.artifacts import ArtifactCache, unpack_mlpackage
from agent.drivers.base import ArtifactError
from agent.runner import failure_reason
from tests.support.simulated import (
    artifact_of_bytes,
    content_addressed,
    manifest,
    simulate,
    write_package,
    zip_directory,
)


def test_a_zip_of_the_package_contents_is_accepted_too(tmp_path: Path) -> None:
    package = write_package(tmp_path / "build")
    flat = content_addressed(zip_directory(package, tmp_path / "flat.zip", keep_top=False))

    result = simulate(tmp_path, flat)

    assert result.simulated


def test_non_zip_artifact_fails_with_a_clear_reason(tmp_path: Path) -> None:
    bogus = artifact_of_bytes(tmp_path, b"<html>502 Bad Gateway</html>")

    with pytest.raises(ArtifactError, match="not a zip archive"):
        simulate(tmp_path, bogus)


def test_artifact_without_manifest_fails_with_a_clear_reason(tmp_path: Path) -> None:
    package = write_package(tmp_path / "build")
    (package / "Manifest.json").unlink()
    artifact = content_addressed(zip_directory(package, tmp_path / "a.zip"))

    with pytest.raises(ArtifactError, match=r"contains no Manifest\.json"):
        simulate(tmp_path, artifact)


def test_truncated_artifact_fails_with_a_clear_reason(tmp_path: Path, artifact: Path) -> None:
    data = artifact.read_bytes()
    truncated = artifact_of_bytes(tmp_path, data[: len(data) // 2])

    with pytest.raises(ArtifactError, match="not a zip archive|damaged"):
        simulate(tmp_path, truncated)


def test_flipped_byte_in_the_weights_fails_the_checksum(tmp_path: Path, artifact: Path) -> None:
    data = bytearray(artifact.read_bytes())
    offset = bytes(data).index(bytes(range(256))) + 100  # inside weight.bin, stored uncompressed
    data[offset] ^= 0xFF
    damaged = artifact_of_bytes(tmp_path, bytes(data))

    with pytest.raises(ArtifactError, match=r"damaged: checksum mismatch in .*weight\.bin"):
        simulate(tmp_path, damaged)


def test_manifest_naming_a_missing_item_fails(tmp_path: Path) -> None:
    package = write_package(tmp_path / "build")
    (package / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").unlink()
    (package / "Data" / "com.apple.CoreML" / "weights").rmdir()
    artifact = content_addressed(zip_directory(package, tmp_path / "a.zip"))

    with pytest.raises(ArtifactError, match=r"lists com\.apple\.CoreML/weights but the package"):
        simulate(tmp_path, artifact)


def test_unreadable_manifest_fails(tmp_path: Path) -> None:
    package = write_package(tmp_path / "build")
    (package / "Manifest.json").write_text("{not json")
    artifact = content_addressed(zip_directory(package, tmp_path / "a.zip"))

    with pytest.raises(ArtifactError, match="Manifest.json of decoder.mlpackage is unreadable"):
        simulate(tmp_path, artifact)


def test_member_paths_escaping_the_destination_are_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("decoder.mlpackage/Manifest.json", manifest({}))
        archive.writestr("../outside.txt", "gotcha")

    with pytest.raises(ArtifactError, match="escapes the package folder"):
        unpack_mlpackage(evil, tmp_path / "out")
    assert not (tmp_path / "outside.txt").exists()


def test_two_packages_in_one_artifact_are_refused(tmp_path: Path) -> None:
    double = tmp_path / "double.zip"
    with zipfile.ZipFile(double, "w") as archive:
        archive.writestr("a.mlpackage/Manifest.json", manifest({}))
        archive.writestr("b.mlpackage/Manifest.json", manifest({}))

    with pytest.raises(ArtifactError, match="more than one package"):
        unpack_mlpackage(double, tmp_path / "out")


def test_artifact_failures_are_reported_as_not_retryable(tmp_path: Path) -> None:
    bogus = artifact_of_bytes(tmp_path, b"not a zip")
    with pytest.raises(ArtifactError) as caught:
        simulate(tmp_path, bogus)

    reason, retryable = failure_reason(caught.value, "running on sim-test-0")

    assert reason.startswith("unusable artifact: artifact ")
    assert "not a zip archive" in reason
    assert retryable is False


def test_the_artifact_cache_downloads_each_artifact_once(tmp_path: Path, artifact: Path) -> None:
    downloads: list[str] = []

    def download(sha256: str, destination: Path) -> Path:
        downloads.append(sha256)
        destination.write_bytes(artifact.read_bytes())
        return destination

    cache = ArtifactCache(tmp_path / "cache", download)
    paths = [cache.fetch(artifact.stem) for _ in range(3)]

    assert downloads == [artifact.stem]
    assert paths[0] == tmp_path / "cache" / f"{artifact.stem}.zip"
    assert paths[0].read_bytes() == artifact.read_bytes()


def test_concurrent_device_threads_share_one_download(tmp_path: Path, artifact: Path) -> None:
    downloads: list[str] = []

    def slow_download(sha256: str, destination: Path) -> Path:
        downloads.append(sha256)
        time.sleep(0.2)
        destination.write_bytes(artifact.read_bytes())
        return destination

    cache = ArtifactCache(tmp_path / "cache", slow_download)
    threads = [threading.Thread(target=cache.fetch, args=(artifact.stem,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert downloads == [artifact.stem]


def test_a_cached_file_that_no_longer_matches_its_digest_is_fetched_again(
    tmp_path: Path, artifact: Path
) -> None:
    cached = tmp_path / "cache" / f"{artifact.stem}.zip"
    cached.parent.mkdir()
    cached.write_bytes(b"edited by hand")
    downloads: list[str] = []

    def download(sha256: str, destination: Path) -> Path:
        downloads.append(sha256)
        destination.write_bytes(artifact.read_bytes())
        return destination

    ArtifactCache(tmp_path / "cache", download).fetch(artifact.stem)

    assert downloads == [artifact.stem]
    assert cached.read_bytes() == artifact.read_bytes()


def test_cache_refuses_addresses_that_are_not_sha256(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path, lambda sha256, destination: destination)

    with pytest.raises(ArtifactError, match="not a lowercase sha256"):
        cache.fetch("../../etc/passwd")
