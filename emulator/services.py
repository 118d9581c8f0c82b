"""The lockdown services of an emulated iPhone, by the name ``StartService`` asks for.

- ``com.apple.afc``: AFC over ``Media/`` (where installation_proxy stages packages);
- ``com.apple.mobile.installation_proxy``: Install/Upgrade of a staged ``.ipa``, Lookup, Browse,
  Uninstall;
- ``com.apple.mobile.house_arrest``: VendContainer/VendDocuments, then AFC in the app's container;
- ``com.apple.syslog_relay``: the device log, lines ending in ``\\n\\0``;
- ``com.apple.mobile.mobile_image_mounter``: the developer disk image (``mounter``);
- ``com.apple.instruments.remoteserver.DVTSecureSocketProxy``: DVT process control over TLS
  (``instruments``), offered only once the developer disk image is mounted, and only before
  iOS 17: from 17 lockdown refuses it as iOS does, and DVT is reached through the tunnel.
"""

from __future__ import annotations

import asyncio
import plistlib
import shutil
import uuid
import zipfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from emulator.afc import AfcServer
from emulator.device import AppRecord, ServiceHandler
from emulator.instruments import LOCKDOWN_SERVICE, serve_instruments_tls
from emulator.mounter import serve_image_mounter
from emulator.wire import read_plist, write_plist

if TYPE_CHECKING:
    from emulator.device import EmulatedDevice

SYSLOG_LINE_END = b"\n\x00"
# The first iOS whose developer services are reached through the tunnel only.
TUNNEL_ONLY_FROM = 17


async def serve_afc(
    device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    await AfcServer(device.media).serve(reader, writer)


async def serve_house_arrest(
    device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    request = await read_plist(reader)
    command, bundle_id = request.get("Command"), request.get("Identifier", "")
    if command not in {"VendContainer", "VendDocuments"}:
        await write_plist(writer, {"Error": "UnknownCommand"})
        return
    if bundle_id not in device.apps:
        await write_plist(writer, {"Error": "ApplicationLookupFailed"})
        return
    await write_plist(writer, {"Status": "Complete"})
    jail = "/Documents" if command == "VendDocuments" else "/"
    server = AfcServer(device.container(bundle_id), jail=jail, on_write=device.note_pushed)
    await server.serve(reader, writer)


async def serve_installation_proxy(
    device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    while True:
        request = await read_plist(reader)
        command = request.get("Command")
        options: dict[str, Any] = request.get("ClientOptions") or {}
        if command in {"Install", "Upgrade"}:
            await _install(device, writer, str(request.get("PackagePath", "")))
        elif command == "Lookup":
            result = {
                bundle_id: _app_info(record, options.get("ReturnAttributes"))
                for bundle_id, record in device.apps.items()
                if bundle_id in options.get("BundleIDs", device.apps)
            }
            await write_plist(writer, {"LookupResult": result, "Status": "Complete"})
        elif command == "Browse":
            apps = [
                _app_info(record, options.get("ReturnAttributes"))
                for record in device.apps.values()
            ]
            await write_plist(writer, {"CurrentList": apps, "Status": "BrowsingApplications"})
            await write_plist(writer, {"Status": "Complete"})
        elif command == "Uninstall":
            if device.uninstall(str(request.get("ApplicationIdentifier", ""))):
                await write_plist(writer, {"Status": "Complete"})
            else:
                await write_plist(
                    writer, {"Error": "APIInternalError", "ErrorDescription": "not installed"}
                )
        else:
            await write_plist(writer, {"Error": "UnknownCommand", "ErrorDescription": str(command)})


def _app_info(record: AppRecord, attributes: list[str] | None) -> dict[str, Any]:
    info = dict(record.info)
    info.update(
        CFBundleIdentifier=record.bundle_id,
        CFBundleVersion=record.version,
        CFBundleShortVersionString=record.short_version,
        ApplicationType="User",
        Path=str(record.bundle_path),
    )
    return {key: info[key] for key in attributes if key in info} if attributes else info


async def _install(device: EmulatedDevice, writer: asyncio.StreamWriter, package_path: str) -> None:
    staged = device.media / PurePosixPath(package_path).as_posix().lstrip("/")
    if ".." in PurePosixPath(package_path).parts or not staged.is_file():
        await write_plist(
            writer,
            {
                "Error": "PackageInspectionFailed",
                "ErrorDescription": f"no package at {package_path}",
            },
        )
        return
    for percent, status in (
        (5, "CreatingStagingDirectory"),
        (15, "ExtractingPackage"),
        (40, "InspectingPackage"),
    ):
        await write_plist(writer, {"Status": status, "PercentComplete": percent})
    try:
        record = _unpack_app(staged, device.root / "Bundles")
    except (zipfile.BadZipFile, KeyError, ValueError, plistlib.InvalidFileException) as error:
        await write_plist(
            writer, {"Error": "PackageInspectionFailed", "ErrorDescription": str(error)}
        )
        return
    for percent, status in ((60, "VerifyingApplication"), (90, "InstallingApplication")):
        await write_plist(writer, {"Status": status, "PercentComplete": percent})
    device.install(record)
    await write_plist(writer, {"Status": "Complete"})


def _unpack_app(ipa: Path, bundles: Path) -> AppRecord:
    with zipfile.ZipFile(ipa) as archive:
        names = archive.namelist()
        info_names = [
            name
            for name in names
            if len(PurePosixPath(name).parts) == 3 and name.endswith(".app/Info.plist")
        ]
        if not info_names or not info_names[0].startswith("Payload/"):
            raise ValueError("the package has no Payload/<name>.app/Info.plist")
        info = plistlib.loads(archive.read(info_names[0]))
        bundle_id = info["CFBundleIdentifier"]
        app_dir = PurePosixPath(info_names[0]).parent
        target = bundles / str(uuid.uuid4()).upper() / app_dir.name
        for name in names:
            member = PurePosixPath(name)
            if ".." in member.parts or not name.startswith(f"{app_dir}/") or name.endswith("/"):
                continue
            destination = target / member.relative_to(app_dir)
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(name) as source, destination.open("wb") as out:
                shutil.copyfileobj(source, out)
    return AppRecord(
        bundle_id=bundle_id,
        version=str(info.get("CFBundleVersion", "1")),
        short_version=str(info.get("CFBundleShortVersionString", "1.0")),
        display_name=str(info.get("CFBundleDisplayName", info.get("CFBundleName", bundle_id))),
        bundle_path=target,
        info=info,
    )


async def serve_syslog_relay(
    device: EmulatedDevice, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    queue = device.syslog.subscribe()
    closed = asyncio.ensure_future(reader.read())
    try:
        while True:
            line = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({line, closed}, return_when=asyncio.FIRST_COMPLETED)
            if line not in done:
                line.cancel()
                return
            writer.write(line.result().encode() + SYSLOG_LINE_END)
            await writer.drain()
    finally:
        closed.cancel()
        device.syslog.unsubscribe(queue)


SERVICES: dict[str, ServiceHandler] = {
    "com.apple.afc": serve_afc,
    "com.apple.mobile.house_arrest": serve_house_arrest,
    "com.apple.mobile.installation_proxy": serve_installation_proxy,
    "com.apple.syslog_relay": serve_syslog_relay,
    LOCKDOWN_SERVICE: serve_instruments_tls,
    "com.apple.mobile.mobile_image_mounter": serve_image_mounter,
}


def needs_developer_image(service: str) -> bool:
    return service == LOCKDOWN_SERVICE


def tunnel_only(service: str, major_version: int) -> bool:
    """Developer services that iOS 17+ serves only through the RemoteXPC tunnel (RSD, as
    ``com.apple.instruments.dtservicehub``): lockdown answers ``InvalidService`` for them even
    with the disk image mounted, so a host that reaches for lockdown DVT fails on a real phone."""
    return major_version >= TUNNEL_ONLY_FROM and needs_developer_image(service)


def uses_tls(service: str) -> bool:
    """Services whose connection switches to TLS (the pair record's certificates) at once."""
    return service == LOCKDOWN_SERVICE
