"""The fleet page's figures: what each device runs, how much waits per class, what failed."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from decodebench.contracts.profiles import DEVICE_PROFILES
from server import tenancy
from server.agents.service import list_devices
from server.models import Device, Run, RunState
from server.sweeps.control import ready_devices_by_class

RECENT_FAILURES = 20


def fleet_context(session: Session) -> dict:
    devices: list[Device] = list_devices(session)
    running = {
        run.device_udid: run
        for run in session.scalars(
            select(Run).where(Run.state == RunState.running.value, tenancy.runs(session))
        )
    }
    # A shared device running another project's run is shown busy, without the run.
    busy = set(session.scalars(select(Run.device_udid).where(Run.state == RunState.running.value)))
    queued = dict(
        session.execute(
            select(Run.device_class, func.count())
            .where(Run.state == RunState.queued.value, tenancy.runs(session))
            .group_by(Run.device_class)
        ).all()
    )
    ready = ready_devices_by_class(session)
    classes = sorted(set(DEVICE_PROFILES) | set(queued) | {d.device_class for d in devices})
    failures = session.scalars(
        select(Run)
        .where(Run.state == RunState.failed.value, tenancy.runs(session))
        .order_by(Run.finished_at.desc().nulls_last(), Run.id.desc())
        .limit(RECENT_FAILURES)
    ).all()
    return {
        "devices": [device for device in devices if device.connected],
        "gone": [device for device in devices if not device.connected],
        "current_run": running,
        "busy": busy,
        "queues": [
            {
                "device_class": name,
                "display_name": DEVICE_PROFILES[name].display_name
                if name in DEVICE_PROFILES
                else name,
                "queued": queued.get(name, 0),
                "ready": ready.get(name, 0),
            }
            for name in classes
        ],
        "failures": failures,
    }
