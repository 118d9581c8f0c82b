"""Broker settings shared by the server (sends tasks) and the build workers (consume them)."""

from __future__ import annotations

import os
from pathlib import Path

BUILD_TASK = "decodebench.build_variant"
RECONCILE_TASK = "decodebench.reconcile"
SCHEDULE_TICK_TASK = "decodebench.schedule_tick"
DOCTOR_TASK = "decodebench.doctor"
BUILD_QUEUE = "builds"  # doctor jobs too: the same workers, one job at a time


def transport_options(broker_url: str) -> dict[str, object]:
    """The file-system broker (embedded defaults, no Redis) needs a shared folder."""
    if not broker_url.startswith("filesystem://"):
        return {}
    folder = Path(os.environ.get("DECODEBENCH_BROKER_FOLDER", "var/broker")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    control = folder / "control"
    control.mkdir(exist_ok=True)
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(control),
    }
