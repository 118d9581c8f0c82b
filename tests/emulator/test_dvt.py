"""DVT, the developer disk image and the iOS 17+ tunnel of the emulated iPhone, through
pymobiledevice3's own clients (DvtProvider, ProcessControl, DeviceInfo, the image mounters,
tunneld's API and RemoteServiceDiscovery), and the agent's use of them (DvtLauncher,
ensure_mounted, the device checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pymobiledevice3.dtx import DTXNsError
from pymobiledevice3.exceptions import InvalidServiceError
from pymobiledevice3.lockdown import LockdownClient, create_using_usbmux
from pymobiledevice3.services.dvt.instruments.device_info import DeviceInfo as DvtDeviceInfo
from pymobiledevice3.services.dvt.instruments.dvt_provider import DvtProvider
from pymobiledevice3.services.dvt.instruments.process_control import ProcessControl
from pymobiledevice3.services.installation_proxy import InstallationProxyService
from pymobiledevice3.tunneld.api import get_tunneld_device_by_udid

from agent.drivers.base import DriverError
from agent.drivers.ios.checks import CheckContext, device_checks
from agent.drivers.ios.ddi import ensure_mounted, is_mounted
from agent.drivers.ios.errors import DDI_NOT_MOUNTED, NO_TUNNEL, PROFILE_UNTRUSTED
from agent.drivers.ios.launchers import AppLaunch, DvtLauncher
from decodebench.harness import HARNESS_BUNDLE_ID, JOB_FILE
from emulator import ddi
from emulator.device import EmulatedDevice
from emulator.fleet import EmulatedFleet
from emulator.ipa import make_harness_ipa
from emulator.nskeyed import NSError, archive, unarchive

IOS16 = "ios=16.7.10"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[EmulatedFleet]:
    running = EmulatedFleet(tmp_path / "devices", tokens="off")
    yield running
    running.stop()


@pytest.fixture
def ddi_folder(tmp_path: Path) -> Path:
    return ddi.write_ddi_folder(tmp_path / "ddi", classic_versions=("16.6", "16.7"))


@contextlib.asynccontextmanager
async def lockdown(fleet: EmulatedFleet, device: EmulatedDevice) -> AsyncIterator[LockdownClient]:
    client = await create_using_usbmux(
        serial=device.udid,
        autopair=False,
        usbmux_address=fleet.address,
        pairing_records_cache_folder=fleet.root / "pair-records",
    )
    try:
        yield client
    finally:
        await client.close()


async def install_harness(client: LockdownClient, tmp_path: Path) -> None:
    async with InstallationProxyService(client) as proxy:
        await proxy.install_from_local(make_harness_ipa(tmp_path / "harness.ipa"))


def test_the_keyed_archive_codec_round_trips_foundation_values() -> None:
    value = {"a": [1, 2.5, True, None, b"\x00x"], "nested": {"s": "é"}, "error": None}
    assert unarchive(archive(value)) == value
    error = unarchive(archive(NSError("Domain", 3, {"NSLocalizedDescription": "why"})))
    assert error == NSError("Domain", 3, {"NSLocalizedDescription": "why"})


def test_ios_16_launches_over_lockdown_dvt_only_after_the_disk_image_is_mounted(
    fleet: EmulatedFleet, ddi_folder: Path, tmp_path: Path
) -> None:
    device = fleet.add("iphone-16-pro", [IOS16])
    fleet.start()

    async def scenario() -> None:
        async with lockdown(fleet, device) as client:
            await install_harness(client, tmp_path)
            with pytest.raises(InvalidServiceError):  # no DVT without the developer disk image
                async with DvtProvider(client):
                    pass
            assert not await is_mounted(client)
            assert "mounted the developer disk image" in await ensure_mounted(client, ddi_folder)
            assert await is_mounted(client)
            assert "already mounted" in await ensure_mounted(client, ddi_folder)
            async with DvtProvider(client) as dvt, ProcessControl(dvt) as control:
                pid = await control.launch(
                    HARNESS_BUNDLE_ID, ["--job", JOB_FILE], environment={"RUN": "7"}
                )
                process = device.processes[pid]
                assert process.environment == {"RUN": "7"}
                async with DvtDeviceInfo(dvt) as info:
                    for _ in range(200):  # no job.json was pushed: the harness exits at once
                        if not await info.is_running_pid(pid):
                            break
                        await asyncio.sleep(0.01)
                    assert not await info.is_running_pid(pid)
                assert (process.state, process.exit_reason) == ("exited", "exit code 1")

    asyncio.run(scenario())
    assert device.mounted_image == "Developer"


@pytest.mark.parametrize(
    ("specs", "folder_versions", "reason"),
    [
        ([IOS16], ("16.6",), "no DeveloperDiskImage.dmg and .signature for iOS 16.7"),
        ([IOS16, "ddi-mount-refused"], ("16.7",), "the phone refused the mount"),
        (["ddi-mount-refused"], ("16.7",), "the phone refused the mount"),
        ([IOS16, "developer-mode-off"], ("16.7",), "DeveloperModeIsNotEnabledError"),
    ],
)
def test_disk_image_failures_name_their_reason_and_the_fix(
    fleet: EmulatedFleet,
    tmp_path: Path,
    specs: list[str],
    folder_versions: tuple[str, ...],
    reason: str,
) -> None:
    device = fleet.add("iphone-16-pro", specs)
    fleet.start()
    folder = ddi.write_ddi_folder(tmp_path / "ddi", classic_versions=folder_versions)

    async def mount() -> None:
        async with lockdown(fleet, device) as client:
            await ensure_mounted(client, folder)

    with pytest.raises(DriverError) as caught:
        asyncio.run(mount())
    if reason.endswith("Error"):  # pymobiledevice3's own refusal before any upload
        assert reason in type(caught.value.__cause__).__name__ or reason in repr(caught.value)
    else:
        assert reason in str(caught.value)
        assert caught.value.device_status == DDI_NOT_MOUNTED
    assert device.mounted_image is None


def test_a_wrong_image_is_refused_by_the_phone(fleet: EmulatedFleet, tmp_path: Path) -> None:
    device = fleet.add("iphone-16-pro", [IOS16])
    fleet.start()
    folder = ddi.write_ddi_folder(tmp_path / "ddi", classic_versions=("16.6",))
    (folder / "DeviceSupport" / "16.6").rename(folder / "DeviceSupport" / "16.7")  # misfiled

    async def mount() -> None:
        async with lockdown(fleet, device) as client:
            await ensure_mounted(client, folder)

    with pytest.raises(DriverError, match="The image is for iOS 16.6, this device runs 16.7"):
        asyncio.run(mount())


def test_a_personalized_image_the_phone_was_never_personalized_for_is_not_mounted(
    fleet: EmulatedFleet, ddi_folder: Path
) -> None:
    device = fleet.add("iphone-17-pro")
    fleet.start()
    (ddi_folder / "Personalized" / "Image.dmg").write_bytes(b"another build" + bytes(100))

    async def mount() -> None:
        async with lockdown(fleet, device) as client:
            await ensure_mounted(client, ddi_folder)

    with pytest.raises(DriverError, match="holds no personalization manifest") as caught:
        asyncio.run(mount())
    assert "pymobiledevice3 mounter auto-mount" in str(caught.value)  # never Apple's server here
    assert device.mounted_image is None


def test_ios_18_goes_through_tunneld_and_remote_service_discovery(
    fleet: EmulatedFleet, ddi_folder: Path, tmp_path: Path
) -> None:
    device = fleet.add("iphone-16-pro")  # reports iOS 18.6.2
    fleet.start()
    launcher = DvtLauncher(fleet.tunneld_address)

    async def scenario() -> None:
        rsd = await get_tunneld_device_by_udid(device.udid, fleet.tunneld_address)
        assert rsd is not None and rsd.product_version == device.identity.product_version
        assert "com.apple.instruments.dtservicehub" not in rsd.peer_info["Services"]  # no DDI
        await rsd.close()
        async with lockdown(fleet, device) as client:
            await install_harness(client, tmp_path)
            await ensure_mounted(client, ddi_folder)  # personalized: the phone's manifest
            pid = await launcher.launch(client, AppLaunch(HARNESS_BUNDLE_ID, ["--job", JOB_FILE]))
            state = await launcher.state(client, pid)
            for _ in range(100):
                if state.running is False:
                    break
                await asyncio.sleep(0.02)
                state = await launcher.state(client, pid)
            # no job.json: the harness exits at once, which DVT's termination notice reports
            assert state == type(state)(False, "exited with code 1")
            assert any("no job.json" in line for line in launcher.output(device.udid))
            await launcher.kill(client, pid)

    asyncio.run(scenario())
    assert device.mounted_image == "Personalized"


def proclist(fleet: EmulatedFleet, device: EmulatedDevice) -> subprocess.CompletedProcess[str]:
    """pymobiledevice3's own `developer dvt proclist`, over lockdown (no tunnel, no RSD)."""
    command = ["developer", "dvt", "proclist", "--usbmux", fleet.address, "--udid", device.udid]
    return subprocess.run(
        [sys.executable, "-m", "pymobiledevice3", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_lockdown_dvt_is_refused_from_ios_17_as_on_a_real_phone(
    fleet: EmulatedFleet, tmp_path: Path
) -> None:
    """iOS 17+ serves its developer services only through the tunnel: a host that reached for
    lockdown DVT would pass here and fail on the first real phone, so the emulator refuses it."""
    old = fleet.add("iphone-16-pro", [IOS16, "ddi-mounted"])
    new = fleet.add("iphone-16-pro", ["ddi-mounted"])  # iOS 18, disk image mounted
    fleet.start()

    listed = proclist(fleet, old)
    assert listed.returncode == 0, listed.stderr
    assert isinstance(json.loads(listed.stdout), list)  # the process list, empty here

    refused = proclist(fleet, new)  # lockdown answers InvalidService: the CLI, as against a
    assert refused.returncode != 0  # real iOS 17+ phone, gives up on lockdown for a tunnel
    assert "developer command on an iOS 17+ device" in refused.stderr

    async def through_the_library() -> None:
        async with lockdown(fleet, new) as client:
            with pytest.raises(InvalidServiceError):
                async with DvtProvider(client):
                    pass

    asyncio.run(through_the_library())
    assert new.mounted_image == "Personalized"  # refused with the image mounted


def test_a_dropped_tunnel_and_a_denied_launch_carry_their_device_status(
    fleet: EmulatedFleet, ddi_folder: Path, tmp_path: Path
) -> None:
    untrusted = fleet.add("iphone-16-pro", ["untrusted-profile", "ddi-mounted"])
    tunnelled = fleet.add("iphone-17-pro", ["ddi-mounted"])
    fleet.start()
    launcher = DvtLauncher(fleet.tunneld_address)

    async def launch(device: EmulatedDevice) -> int:
        async with lockdown(fleet, device) as client:
            await install_harness(client, tmp_path)
            return await launcher.launch(client, AppLaunch(HARNESS_BUNDLE_ID))

    with pytest.raises(DriverError) as denied:
        asyncio.run(launch(untrusted))
    assert denied.value.device_status == PROFILE_UNTRUSTED
    assert "not been explicitly trusted" in str(denied.value)
    assert "VPN & Device Management" in str(denied.value)
    assert isinstance(denied.value.__cause__, DTXNsError)

    fleet.drop_tunnel(1)
    with pytest.raises(DriverError) as no_tunnel:
        asyncio.run(launch(tunnelled))
    assert no_tunnel.value.device_status == NO_TUNNEL
    assert "pymobiledevice3 remote tunneld" in str(no_tunnel.value)
    fleet.restore_tunnel(1)
    assert asyncio.run(launch(tunnelled)) > 0


def test_the_os_killing_the_app_is_reported_by_the_termination_notice(
    fleet: EmulatedFleet, tmp_path: Path
) -> None:
    device = fleet.add("iphone-17-pro", ["ddi-mounted", "killed-by-os"])
    fleet.start()
    launcher = DvtLauncher(fleet.tunneld_address)

    async def scenario() -> str:
        async with lockdown(fleet, device) as client:
            await install_harness(client, tmp_path)
            pid = await launcher.launch(client, AppLaunch(HARNESS_BUNDLE_ID))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                state = await launcher.state(client, pid)
                if state.running is False:
                    return state.reason
                await asyncio.sleep(0.02)
            return "still running"

    assert asyncio.run(scenario()).startswith("killed (SIGKILL")


def test_device_checks_report_each_broken_precondition_with_its_fix(
    fleet: EmulatedFleet, ddi_folder: Path
) -> None:
    fleet.add("iphone-16-pro", [IOS16, "battery=5", "charging=false"])
    fleet.add("iphone-17-pro", ["no-tunnel", "free=1e9"])
    fleet.add("iphone-16-pro", ["developer-mode-off"])
    fleet.start()

    async def checks(device: EmulatedDevice) -> dict[str, tuple[bool | None, str]]:
        context = CheckContext(
            bundle_id=HARNESS_BUNDLE_ID,
            ipa_version=None,
            tunneld=fleet.tunneld_address,
            largest_model_bytes=2 * 10**9,
            ddi_folder=ddi_folder,
        )
        async with lockdown(fleet, device) as client:
            return {item.name: (item.ok, item.fix) for item in await device_checks(client, context)}

    old, no_tunnel, no_developer_mode = (asyncio.run(checks(device)) for device in fleet.devices)
    assert old["battery"][0] is False and "powered hub" in old["battery"][1]
    assert "tunnel" not in old  # iOS 16: no tunnel needed
    assert old["developer disk image"][0] is True  # not mounted, but the folder has its image
    assert (
        old["harness app"] == (False, old["harness app"][1])
        and "ios_harness" in old["harness app"][1]
    )
    assert no_tunnel["tunnel"][0] is False and "remote tunneld" in no_tunnel["tunnel"][1]
    assert no_tunnel["free space"][0] is False and "iPhone Storage" in no_tunnel["free space"][1]
    assert no_developer_mode["developer mode"][0] is False
    assert "Developer Mode" in no_developer_mode["developer mode"][1]
    assert all(ok for name, (ok, _) in no_developer_mode.items() if name == "tunnel")
