"""Developer disk images for emulated iPhones, laid out as an operator's DDI folder holds them.

A real phone checks Apple's signature over the image (classic images, before iOS 17) or an IM4M
manifest personalized for its ECID (iOS 17+). Apple's keys and its signing server are out of
reach, so the emulated "signature" is a digest under a fixed emulator key; what the tests
exercise is everything around it: finding the image for the device's version, uploading it
over the mounter service, the personalization manifest the phone already holds, the refusals.

Folder layout (the agent's ``--ddi-folder``, as Xcode ships the images):

- ``DeviceSupport/<major.minor>/DeveloperDiskImage.dmg`` and ``….dmg.signature`` (iOS < 17);
- ``Personalized/Image.dmg``, ``Image.dmg.trustcache``, ``BuildManifest.plist`` (iOS 17+).
"""

from __future__ import annotations

import hashlib
import plistlib
from pathlib import Path

EMULATOR_KEY = b"decodebench emulated image signing key"
CLASSIC_PREFIX = b"decodebench emulated DeveloperDiskImage for iOS "
PERSONALIZED_IMAGE = b"decodebench emulated Personalized DeveloperDiskImage\n" + bytes(4096)
PERSONALIZED_BUILD = "17A5500e"


def signature(image: bytes) -> bytes:
    """The emulated stand-in for Apple's signature over a classic image."""
    return hashlib.sha384(EMULATOR_KEY + image).digest()


def personalization_manifest(ecid: int, image_digest: bytes) -> bytes:
    """The emulated stand-in for the IM4M ticket a phone keeps once personalized."""
    return b"IM4M" + hashlib.sha384(EMULATOR_KEY + ecid.to_bytes(8, "big") + image_digest).digest()


def classic_image(version: str) -> bytes:
    major_minor = ".".join(version.split(".")[:2])
    return CLASSIC_PREFIX + major_minor.encode() + b"\n" + bytes(4096)


def classic_image_version(image: bytes) -> str | None:
    """The iOS version a classic emulated image is for; None if it is not one."""
    if not image.startswith(CLASSIC_PREFIX):
        return None
    return image[len(CLASSIC_PREFIX) :].split(b"\n", 1)[0].decode(errors="replace")


def write_ddi_folder(folder: Path, classic_versions: tuple[str, ...] = ("16.7",)) -> Path:
    """An operator's DDI folder with emulated images (classic ones for `classic_versions`)."""
    for version in classic_versions:
        target = folder / "DeviceSupport" / version
        target.mkdir(parents=True, exist_ok=True)
        image = classic_image(version)
        (target / "DeveloperDiskImage.dmg").write_bytes(image)
        (target / "DeveloperDiskImage.dmg.signature").write_bytes(signature(image))
    personalized = folder / "Personalized"
    personalized.mkdir(parents=True, exist_ok=True)
    (personalized / "Image.dmg").write_bytes(PERSONALIZED_IMAGE)
    (personalized / "Image.dmg.trustcache").write_bytes(b"trustcache\0" + bytes(60))
    (personalized / "BuildManifest.plist").write_bytes(
        plistlib.dumps({"ProductBuildVersion": PERSONALIZED_BUILD, "BuildIdentities": []})
    )
    return folder
