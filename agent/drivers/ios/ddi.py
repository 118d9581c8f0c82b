"""The developer disk image: is it mounted, and mounting it from the operator's folder.

DVT (and so launching the harness) exists on a phone only while its developer disk image is
mounted; it is unmounted at every reboot. The agent never downloads one: the operator points
``--ddi-folder`` at the images Xcode ships (see agent/README.md):

- before iOS 17, ``DeviceSupport/<major.minor>/DeveloperDiskImage.dmg`` and its ``.signature``;
- from iOS 17, ``Personalized/Image.dmg``, ``Image.dmg.trustcache`` and ``BuildManifest.plist``.
  The phone must already hold a personalization manifest for that image (it does once Xcode or
  ``pymobiledevice3 mounter auto-mount`` mounted it there); getting a new one needs Apple's
  signing server, which the agent does not contact.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from packaging.version import Version
from pymobiledevice3.exceptions import (
    AlreadyMountedError,
    MissingManifestError,
    PyMobileDevice3Exception,
)
from pymobiledevice3.lockdown_service_provider import LockdownServiceProvider
from pymobiledevice3.services.mobile_image_mounter import (
    DeveloperDiskImageMounter,
    MobileImageMounterService,
    PersonalizedImageMounter,
)

from agent.drivers.ios.errors import ddi_error

PERSONALIZED_FROM = Version("17.0")


def mounter_for(provider: LockdownServiceProvider) -> MobileImageMounterService:
    if Version(provider.product_version) >= PERSONALIZED_FROM:
        return PersonalizedImageMounter(provider)
    return DeveloperDiskImageMounter(provider)


async def is_mounted(provider: LockdownServiceProvider) -> bool:
    mounter = mounter_for(provider)
    async with mounter:
        assert mounter.IMAGE_TYPE is not None
        return await mounter.is_image_mounted(mounter.IMAGE_TYPE)


def classic_image(folder: Path, version: str) -> tuple[Path, Path]:
    major_minor = ".".join(version.split(".")[:2])
    directory = folder / "DeviceSupport" / major_minor
    image = directory / "DeveloperDiskImage.dmg"
    signature = directory / "DeveloperDiskImage.dmg.signature"
    if not image.is_file() or not signature.is_file():
        raise FileNotFoundError(
            f"no DeveloperDiskImage.dmg and .signature for iOS {major_minor} in {directory}"
        )
    return image, signature


def personalized_image(folder: Path) -> tuple[Path, Path, Path]:
    directory = folder / "Personalized"
    files = (
        directory / "Image.dmg",
        directory / "Image.dmg.trustcache",
        directory / "BuildManifest.plist",
    )
    missing = [path.name for path in files if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"{directory} lacks {', '.join(missing)}")
    return files


async def ensure_mounted(provider: LockdownServiceProvider, folder: Path | None) -> str:
    """Mount the developer disk image unless it is; what was done. DriverError with the fix."""
    udid = str(provider.udid)
    if await is_mounted(provider):
        return "developer disk image already mounted"
    if folder is None:
        raise ddi_error(udid, "no --ddi-folder is configured to mount it from")
    version = provider.product_version
    try:
        if Version(version) >= PERSONALIZED_FROM:
            await _mount_personalized(provider, *personalized_image(folder))
        else:
            image, signature = classic_image(folder, version)
            async with DeveloperDiskImageMounter(provider) as mounter:
                await mounter.mount(image, signature)
    except FileNotFoundError as error:
        raise ddi_error(udid, str(error)) from error
    except AlreadyMountedError:
        return "developer disk image already mounted"
    except MissingManifestError as error:
        raise ddi_error(
            udid,
            f"the phone holds no personalization manifest for {folder / 'Personalized'}; mount it "
            "once with Xcode or `pymobiledevice3 mounter auto-mount` on a host with internet",
        ) from error
    except PyMobileDevice3Exception as error:
        raise ddi_error(udid, f"the phone refused the mount: {error}") from error
    return f"mounted the developer disk image from {folder}"


async def _mount_personalized(
    provider: LockdownServiceProvider, image: Path, trust_cache: Path, build_manifest: Path
) -> None:
    """PersonalizedImageMounter.mount without its fallback to Apple's signing server."""
    async with PersonalizedImageMounter(provider) as mounter:
        await mounter.raise_if_cannot_mount()
        image_bytes = image.read_bytes()
        manifest = await mounter.query_personalization_manifest(
            "DeveloperDiskImage", hashlib.sha384(image_bytes).digest()
        )
        await mounter.upload_image(mounter.IMAGE_TYPE, image_bytes, manifest)
        await mounter.mount_image(
            mounter.IMAGE_TYPE, manifest, extras={"ImageTrustCache": trust_cache.read_bytes()}
        )
    del build_manifest  # only Apple's signing server would need it
