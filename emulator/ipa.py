"""A stand-in harness .ipa for emulated iPhones: a Payload/<name>.app with an Info.plist.

Emulated devices run the harness protocol in Python for the bundle id it declares; the bundle
carries no executable code. The real .ipa is built from ios_harness/ (see its README).
"""

from __future__ import annotations

import plistlib
import zipfile
from pathlib import Path

from decodebench.harness import (
    HARNESS_BUNDLE_ID,
    HARNESS_PROCESS_NAME,
    HARNESS_PROTOCOL_VERSION,
)

APP_NAME = HARNESS_PROCESS_NAME


def make_harness_ipa(
    destination: Path, version: str = "1.0", build: str = "1", bundle_id: str = HARNESS_BUNDLE_ID
) -> Path:
    info = {
        "CFBundleIdentifier": bundle_id,
        "CFBundleName": APP_NAME,
        "CFBundleDisplayName": "decodebench harness",
        "CFBundleExecutable": APP_NAME,
        "CFBundleShortVersionString": version,
        "CFBundleVersion": build,
        "UIFileSharingEnabled": True,
        "DecodebenchHarnessProtocol": HARNESS_PROTOCOL_VERSION,
        "DecodebenchEmulated": True,
    }
    destination.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"Payload/{APP_NAME}.app/Info.plist", plistlib.dumps(info))
        archive.writestr(
            f"Payload/{APP_NAME}.app/{APP_NAME}", b"emulated: the harness runs in Python\n"
        )
    return destination
