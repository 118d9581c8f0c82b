"""The emulated iPhone speaks the real wire protocols: pymobiledevice3's own clients, unmodified.

usbmux (list, Listen events, connect, pair records), lockdown (identity, session TLS, values,
services), installation_proxy, house_arrest/AFC (with its Documents jail) and the syslog relay.
"""

from __future__ import annotations

import asyncio
import plistlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymobiledevice3 import usbmux
from pymobiledevice3.exceptions import (
    AfcException,
    AfcFileNotFoundError,
    AppInstallError,
    AppNotInstalledError,
    MissingValueError,
    NotPairedError,
    PasswordRequiredError,
)
from pymobiledevice3.lockdown import UsbmuxLockdownClient, create_using_usbmux
from pymobiledevice3.services.afc import AfcService
from pymobiledevice3.services.house_arrest import HouseArrestService
from pymobiledevice3.services.installation_proxy import InstallationProxyService
from pymobiledevice3.services.syslog import SyslogService

from agent.drivers.ios.syslog import syslog_lines
from decodebench.harness import HARNESS_BUNDLE_ID
from emulator.device import EmulatedDevice
from emulator.fleet import EmulatedFleet
from emulator.ipa import make_harness_ipa


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[EmulatedFleet]:
    running = EmulatedFleet(tmp_path / "devices")
    running.start()
    yield running
    running.stop()


def lockdown(fleet: EmulatedFleet, device: EmulatedDevice, tmp_path: Path):  # type: ignore[no-untyped-def]
    return create_using_usbmux(
        serial=device.udid,
        autopair=False,
        usbmux_address=fleet.address,
        pairing_records_cache_folder=tmp_path / "pair-records",
    )


async def installed(client: UsbmuxLockdownClient, tmp_path: Path) -> None:
    async with InstallationProxyService(client) as proxy:
        await proxy.install_from_local(make_harness_ipa(tmp_path / "harness.ipa"))


def test_usbmux_lists_attached_devices_only(fleet: EmulatedFleet) -> None:
    plugged = fleet.add("iphone-17-pro")
    fleet.add("iphone-16-pro", attached=False)

    devices = asyncio.run(usbmux.list_devices(usbmux_address=fleet.address))

    assert [(d.serial, d.connection_type) for d in devices] == [(plugged.udid, "USB")]


def test_listen_reports_attach_and_detach(fleet: EmulatedFleet) -> None:
    device = fleet.add("iphone-17-pro")

    async def watch() -> list[list[str]]:
        mux = await usbmux.create_mux(usbmux_address=fleet.address)
        seen = []
        try:
            await mux.listen()
            await mux.receive_device_state_update()
            seen.append([d.serial for d in mux.devices])
            await asyncio.to_thread(fleet.usbmuxd.detach, device.udid)
            await mux.receive_device_state_update()
            seen.append([d.serial for d in mux.devices])
            await asyncio.to_thread(fleet.usbmuxd.attach, device.udid)
            await mux.receive_device_state_update()
            seen.append([d.serial for d in mux.devices])
        finally:
            await mux.close()
        return seen

    assert asyncio.run(watch()) == [[device.udid], [], [device.udid]]


def test_lockdown_identity_pairing_and_session_tls(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-16-pro", ["battery=42"])

    async def connect() -> tuple[dict, bool, object, dict, bool]:
        async with await lockdown(fleet, device, tmp_path) as client:
            return (
                client.all_values,
                client.paired,
                client.service.writer.get_extra_info("ssl_object"),
                await client.get_value("com.apple.mobile.battery"),
                await client.get_developer_mode_status(),
            )

    values, paired, tls, battery, developer_mode = asyncio.run(connect())

    assert values["UniqueDeviceID"] == device.udid
    assert values["ProductType"] == "iPhone17,1"
    assert values["ProductVersion"] == device.identity.product_version
    assert paired is True
    assert tls is not None  # StartSession switched the lockdown connection to TLS
    assert battery["BatteryCurrentCapacity"] == 42
    assert developer_mode is True


def test_an_unknown_value_is_a_missing_value(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-17-pro")

    async def ask() -> None:
        async with await lockdown(fleet, device, tmp_path) as client:
            await client.get_value("com.apple.nothing", "Nope")

    with pytest.raises(MissingValueError):
        asyncio.run(ask())


def test_without_a_pair_record_services_are_refused(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-17-pro", ["not-paired"])

    async def connect() -> bool:
        async with await lockdown(fleet, device, tmp_path) as client:
            paired = client.paired
            await client.start_lockdown_service("com.apple.afc")
        return paired

    with pytest.raises(NotPairedError):
        asyncio.run(connect())


def test_a_locked_device_refuses_to_start_services(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-17-pro", ["locked"])

    async def connect() -> None:
        async with await lockdown(fleet, device, tmp_path) as client:
            await client.start_lockdown_service("com.apple.afc")

    with pytest.raises(PasswordRequiredError):
        asyncio.run(connect())


def test_installation_proxy_installs_looks_up_browses_and_uninstalls(
    fleet: EmulatedFleet, tmp_path: Path
) -> None:
    device = fleet.add("iphone-17-pro")

    async def session() -> tuple[dict, list, dict]:
        async with await lockdown(fleet, device, tmp_path) as client:
            await installed(client, tmp_path)
            async with InstallationProxyService(client) as proxy:
                apps = await proxy.get_apps(bundle_identifiers=[HARNESS_BUNDLE_ID])
                browsed = await proxy.browse(attributes=["CFBundleIdentifier"])
                await proxy.uninstall(HARNESS_BUNDLE_ID)
                after = await proxy.get_apps()
        return apps, browsed, after

    apps, browsed, after = asyncio.run(session())

    assert apps[HARNESS_BUNDLE_ID]["CFBundleShortVersionString"] == "1.0"
    assert browsed == [{"CFBundleIdentifier": HARNESS_BUNDLE_ID}]
    assert after == {}
    assert not any((device.media / "PublicStaging").rglob("*.ipa"))  # staging cleaned up


def test_a_package_without_an_app_is_refused(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-17-pro")
    bogus = tmp_path / "bogus.ipa"
    import zipfile

    with zipfile.ZipFile(bogus, "w") as archive:
        archive.writestr("Payload/Thing.app/readme.txt", "no Info.plist")

    async def install() -> None:
        async with await lockdown(fleet, device, tmp_path) as client:
            async with InstallationProxyService(client) as proxy:
                await proxy.install_from_local(bogus)

    with pytest.raises(AppInstallError, match="PackageInspectionFailed"):
        asyncio.run(install())


def test_house_arrest_vends_documents_and_afc_moves_files(
    fleet: EmulatedFleet, tmp_path: Path
) -> None:
    device = fleet.add("iphone-17-pro")
    local = tmp_path / "bundle"
    (local / "Data").mkdir(parents=True)
    (local / "Manifest.json").write_text("{}")
    (local / "Data" / "weight.bin").write_bytes(bytes(range(256)) * 40_000)  # > 4 MiB: streamed

    async def session() -> tuple[list[str], bytes, bool]:
        async with await lockdown(fleet, device, tmp_path) as client:
            await installed(client, tmp_path)
            async with await HouseArrestService.create(
                client, HARNESS_BUNDLE_ID, documents_only=True
            ) as afc:
                await afc.push(str(local), "/Documents", progress_bar=False)
                await afc.rename("/Documents/bundle/Manifest.json", "/Documents/bundle/M.json")
                listing = sorted(await afc.listdir("/Documents/bundle"))
                weights = await afc.get_file_contents("/Documents/bundle/Data/weight.bin")
                await afc.rm("/Documents/bundle")
                gone = not await afc.exists("/Documents/bundle")
        return listing, weights, gone

    listing, weights, gone = asyncio.run(session())

    assert listing == ["Data", "M.json"]
    assert weights == (local / "Data" / "weight.bin").read_bytes()
    assert gone


def test_vended_documents_cannot_be_escaped(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-17-pro")

    async def escape() -> None:
        async with await lockdown(fleet, device, tmp_path) as client:
            await installed(client, tmp_path)
            async with await HouseArrestService.create(
                client, HARNESS_BUNDLE_ID, documents_only=True
            ) as afc:
                await afc.set_file_contents("/Documents/../Library/evil", b"x")

    with pytest.raises(AfcException, match="PERM_DENIED"):
        asyncio.run(escape())
    assert not (device.container(HARNESS_BUNDLE_ID) / "Library" / "evil").exists()


def test_house_arrest_for_a_missing_app_says_not_installed(
    fleet: EmulatedFleet, tmp_path: Path
) -> None:
    device = fleet.add("iphone-17-pro")

    async def vend() -> None:
        async with await lockdown(fleet, device, tmp_path) as client:
            await HouseArrestService.create(client, "com.example.absent", documents_only=True)

    with pytest.raises(AppNotInstalledError):
        asyncio.run(vend())


def test_media_afc_reports_missing_files(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-17-pro")

    async def session() -> bytes:
        async with await lockdown(fleet, device, tmp_path) as client:
            async with AfcService(client) as afc:
                await afc.makedirs("/Downloads/a/b")
                await afc.set_file_contents("/Downloads/a/b/c.txt", b"hello")
                data = await afc.get_file_contents("/Downloads/a/b/c.txt")
                await afc.stat("/Downloads/nothing")
        return data

    with pytest.raises(AfcFileNotFoundError):
        asyncio.run(session())
    assert (device.media / "Downloads" / "a" / "b" / "c.txt").read_bytes() == b"hello"


def test_the_syslog_relay_streams_device_log_lines(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-17-pro")

    async def read_three() -> list[str]:
        async with await lockdown(fleet, device, tmp_path) as client:
            service = SyslogService(client)
            await service.connect()
            for number in range(3):
                device.syslog.emit(f"DecodebenchHarness[7] <Notice>: line {number}")
            lines: list[str] = []
            async for line in syslog_lines(service):
                lines.append(line)
                if len(lines) == 3:
                    break
            await service.close()
        return lines

    assert asyncio.run(read_three()) == [
        f"DecodebenchHarness[7] <Notice>: line {n}" for n in range(3)
    ]


def test_the_pair_record_is_what_usbmuxd_hands_out(fleet: EmulatedFleet) -> None:
    device = fleet.add("iphone-17-pro")

    async def read() -> dict:
        mux = await usbmux.create_mux(usbmux_address=fleet.address)
        try:
            return await mux.get_pair_record(device.udid)
        finally:
            await mux.close()

    record = asyncio.run(read())

    assert record["HostID"] == fleet.host.host_id
    assert plistlib.dumps(record) == plistlib.dumps(device.pair_record)
