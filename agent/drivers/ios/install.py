"""The harness app on a device: installed over installation_proxy when missing or of another
version than the agent's .ipa."""

from __future__ import annotations

import logging
from pathlib import Path

from pymobiledevice3.lockdown import LockdownClient
from pymobiledevice3.services.installation_proxy import InstallationProxyService

from agent.drivers.base import DriverError

log = logging.getLogger(__name__)


async def ensure_harness(
    lockdown: LockdownClient,
    bundle_id: str,
    harness_ipa: Path | None,
    ipa: tuple[str, str, str] | None,
) -> None:
    """Install `harness_ipa` (whose `ipa_version` is `ipa`) unless `bundle_id` is installed at
    that version; with no .ipa, any installed version will do."""
    async with InstallationProxyService(lockdown) as proxy:
        apps = await proxy.get_apps(application_type="User", bundle_identifiers=[bundle_id])
    installed = apps.get(bundle_id)
    installed_version = (
        None
        if installed is None
        else (
            bundle_id,
            str(installed.get("CFBundleShortVersionString")),
            str(installed.get("CFBundleVersion")),
        )
    )
    if installed is not None and (ipa is None or installed_version == ipa):
        return
    if harness_ipa is None:
        raise DriverError(
            f"the harness app {bundle_id} is not installed on device {lockdown.udid} and the "
            "agent has no --harness-ipa to install (build it from ios_harness/)"
        )
    log.info("device %s: installing %s (%s)", lockdown.udid, harness_ipa.name, ipa)
    async with InstallationProxyService(lockdown) as proxy:
        await proxy.install_from_local(harness_ipa)
