"""``com.apple.mobile.mobile_image_mounter`` of an emulated iPhone.

Commands: ``LookupImage``, ``CopyDevices``, ``QueryDeveloperModeStatus``,
``QueryPersonalizationManifest`` (the phone answers only for an image it was personalized for
before: a personalization through Apple's signing server is out of reach), ``ReceiveBytes``
(then the raw image), ``MountImage``, ``UnmountImage``, ``Hangup``. Failure modes: developer mode
off, an image for another iOS version or with a bad signature, a refused mount (fault).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

from emulator import ddi
from emulator.faults import FaultKind
from emulator.wire import read_plist, write_plist

if TYPE_CHECKING:
    from emulator.device import EmulatedDevice

MAX_IMAGE_BYTES = 64 * 2**20
MOUNT_PATHS = {"Developer": "/Developer", "Personalized": "/System/Developer"}


async def serve_image_mounter(
    device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    uploaded: dict[str, tuple[bytes, bytes]] = {}  # image type -> (image, signature)
    while True:
        request = await read_plist(reader)
        command = request.get("Command")
        kind = str(request.get("ImageType", ""))
        if command == "LookupImage":
            mounted = device.mounted_image == kind
            answer: dict[str, Any] = {"ImagePresent": mounted, "Status": "Complete"}
            answer["ImageSignature"] = [device.mounted_signature] if mounted else []
        elif command == "CopyDevices":
            entries = []
            if device.mounted_image is not None:
                entries.append(
                    {
                        "DiskImageType": device.mounted_image,
                        "IsMounted": True,
                        "ImageSignature": device.mounted_signature,
                        "MountPath": MOUNT_PATHS[device.mounted_image],
                    }
                )
            answer = {"EntryList": entries, "Status": "Complete"}
        elif command == "QueryDeveloperModeStatus":
            answer = {"DeveloperModeStatus": device.condition.developer_mode}
        elif command == "QueryPersonalizationManifest":
            digest = bytes(request.get("ImageSignature", b""))
            if digest != hashlib.sha384(ddi.PERSONALIZED_IMAGE).digest():
                await write_plist(writer, {"Error": "MissingManifest"})
                return  # as a real phone does, it hangs up
            manifest = ddi.personalization_manifest(device.identity.unique_chip_id, digest)
            answer = {"ImageSignature": manifest, "Status": "Complete"}
        elif command == "ReceiveBytes":
            size = int(request.get("ImageSize", 0))
            if not 0 < size <= MAX_IMAGE_BYTES:
                answer = {"Error": "InvalidImageSize", "DetailedError": f"{size} bytes"}
            else:
                await write_plist(writer, {"Status": "ReceiveBytesAck"})
                uploaded[kind] = (
                    await reader.readexactly(size),
                    bytes(request.get("ImageSignature", b"")),
                )
                answer = {"Status": "Complete"}
        elif command == "MountImage":
            answer = _mount(device, kind, bytes(request.get("ImageSignature", b"")), uploaded)
        elif command == "UnmountImage":
            if device.mounted_image and MOUNT_PATHS[device.mounted_image] == request.get(
                "MountPath"
            ):
                device.mounted_image, device.mounted_signature = None, b""
                answer = {"Status": "Complete"}
            else:
                answer = {
                    "Error": "UnknownError",
                    "DetailedError": "There is no matching entry in the mount table",
                }
        elif command == "Hangup":
            await write_plist(writer, {"Status": "Complete"})
            return
        else:
            answer = {"Error": "UnknownCommand"}
        await write_plist(writer, answer)


def _mount(
    device: EmulatedDevice, kind: str, signature: bytes, uploaded: dict[str, tuple[bytes, bytes]]
) -> dict[str, Any]:
    def failed(detail: str) -> dict[str, Any]:
        return {"Error": "ImageMountFailed", "DetailedError": detail}

    if not device.condition.developer_mode:
        return failed("Developer mode is not enabled.")
    if device.mounted_image is not None:
        return failed(f"A {device.mounted_image} image is already mounted")
    if kind != device.image_type:
        return failed(f"iOS {device.identity.product_version} mounts {device.image_type} images")
    if kind not in uploaded or uploaded[kind][1] != signature:
        return failed("no image was received for this signature")
    image = uploaded[kind][0]
    if device.faults.take(FaultKind.ddi_mount_refused):
        return failed(
            "Error Domain=com.apple.MobileStorage.ErrorDomain Code=-2 "
            '"Failed to mount the developer disk image: the device refused (mount denied)"'
        )
    if kind == "Developer":
        version = ddi.classic_image_version(image)
        wanted = ".".join(device.identity.product_version.split(".")[:2])
        if version != wanted:
            return failed(f"The image is for iOS {version or 'unknown'}, this device runs {wanted}")
        if signature != ddi.signature(image):
            return failed("Failed to verify the image signature")
    else:
        expected = ddi.personalization_manifest(
            device.identity.unique_chip_id, hashlib.sha384(image).digest()
        )
        if signature != expected:
            return failed("The personalization manifest does not match this device and image")
    device.mounted_image, device.mounted_signature = kind, signature
    device.syslog.emit(f"MobileStorageMounter: mounted {kind} image at {MOUNT_PATHS[kind]}")
    return {"Status": "Complete"}
