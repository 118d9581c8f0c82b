"""The names every role agrees on: life-cycle states, drivers, device statuses, artifact files.

Each is spelled once, here; the database stores their values, the wire carries them, the
pages show them.
"""

from __future__ import annotations

from enum import StrEnum


class SweepState(StrEnum):
    building = "building"
    running = "running"
    completed = "completed"
    failed = "failed"


class SweepPriority(StrEnum):
    """How urgently a sweep wants devices; weighs its share, never starves the others."""

    ci = "ci"  # a CI gate waits on it (`decodebench submit --fail-on-regression`)
    nightly = "nightly"  # a schedule fired it
    adhoc = "adhoc"  # submitted by hand (UI, API)


class BuildState(StrEnum):
    queued = "queued"
    building = "building"
    succeeded = "succeeded"
    failed = "failed"


class RunState(StrEnum):
    waiting_build = "waiting_build"
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


TERMINAL_RUN_STATES = (RunState.succeeded, RunState.failed)


class DeviceStatus(StrEnum):
    """Whether a device can take a run now, or the one reason it cannot; the particulars (how
    long it cools, the battery level, the error) go in ``DeviceInfo.status_detail``."""

    ready = "ready"
    busy = "busy"  # running one of our runs
    offline = "offline"  # its agent stopped
    unreachable = "unreachable"  # the health probe itself failed
    cooling = "cooling"
    low_battery = "low battery"
    locked = "locked"
    not_paired = "not paired"
    developer_mode_off = "developer mode off"
    disconnected = "disconnected"
    usbmuxd_unreachable = "usbmuxd unreachable"
    profile_untrusted = "developer profile not trusted"
    ddi_not_mounted = "developer disk image not mounted"
    no_tunnel = "no tunnel (iOS 17+)"
    killed_by_ios = "harness killed by iOS"


class Driver(StrEnum):
    """How an agent reaches a device, and so how far its timings can be trusted."""

    simulated = "simulated"  # no device: timings from the roofline model
    emulated = "emulated"  # the emulated iPhone over pymobiledevice3's wire protocols
    pymobiledevice3 = "pymobiledevice3"  # a real iPhone over USB
    host = "host"  # the agent host's own CPU, measured for real

    @property
    def fake_device(self) -> bool:
        """Timings of such a device are not measured on hardware."""
        return self in (Driver.simulated, Driver.emulated)


class FormatName(StrEnum):
    """A model format a variant is built in and an uploaded package is in (its code:
    ``decodebench/formats/<name>/``)."""

    coreml = "coreml"  # Core ML: an .mlpackage ML program
    coreai = "coreai"  # Core AI (iOS/macOS 27): an .aimodel asset


DEFAULT_FORMAT = FormatName.coreml
# Each format's package file name inside a build and on the phone.
ARTIFACT_NAMES = {FormatName.coreml: "model.mlpackage", FormatName.coreai: "model.aimodel"}

# Files of a build and of a run, on disk, in the artifact store and on the phone.
PACKAGE_NAME = ARTIFACT_NAMES[DEFAULT_FORMAT]
REPORT_NAME = "build.json"
JOB_FILE = "job.json"
RESULTS_FILE = "results.json"
DONE_MARKER = "done"


# What a build writes in its package's metadata about sliding-window layers (the analysis reads
# it: a program's graph does not say which cache a sliding layer holds).
METADATA_CONTEXT = "decodebench.context"
METADATA_SLIDING_WINDOW = "decodebench.sliding_window"
METADATA_SLIDING_CACHES = "decodebench.sliding_caches"
