"""`python -m agent doctor` as a process, against emulated iPhones with one precondition broken
on each: the failing check is ✗ with its fix, the others ✓, and the exit status says whether
every device is ready."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from emulator.device import Identity

AGENT_NAME = "doctor-lab"
BROKEN = [
    ("iphone-16-pro", "not-paired", "paired and trusted", "pymobiledevice3 lockdown pair"),
    ("iphone-16-pro", "developer-mode-off", "developer mode", "Privacy & Security"),
    ("iphone-16-pro", "locked", "screen unlocked", "Auto-Lock off"),
    ("iphone-16-pro", "ios=15.8", "developer disk image", "DeviceSupport/<version>/"),
    ("iphone-17-pro", "no-tunnel", "tunnel", "sudo pymobiledevice3 remote tunneld"),
    ("iphone-17-pro", "battery=5;charging=false", "battery", "powered hub"),
]


def doctor(
    tmp_path: Path, classes: list[str], faults: list[str]
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "agent",
        "doctor",
        "--driver",
        "emulated",
        "--name",
        AGENT_NAME,
        "--simulated",
        ",".join(classes),
        "--work-dir",
        str(tmp_path / "agent"),
    ]
    for fault in faults:
        command += ["--emulated-fault", fault]
    environment = {key: value for key, value in os.environ.items() if key != "DECODEBENCH_TOKEN"}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=environment, check=False
    )


def device_sections(output: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in output.splitlines():
        if line.startswith("iphone-"):
            current = sections.setdefault(line.split()[2], [])
        elif line.startswith("  "):
            current.append(line.strip())
    return sections


def udid(device_class: str, index: int) -> str:
    seed = hashlib.sha256(AGENT_NAME.encode()).hexdigest()[:16]
    return Identity.for_class(device_class, f"{seed}\0{index}", index + 1).udid


def test_doctor_shows_each_broken_precondition_with_its_fix(tmp_path: Path) -> None:
    faults = [
        f"{index}={spec}"
        for index, (_, specs, _, _) in enumerate(BROKEN)
        for spec in specs.split(";")
    ]
    result = doctor(tmp_path, [device_class for device_class, *_ in BROKEN], faults)

    assert result.returncode == 1, result.stdout + result.stderr
    sections = device_sections(result.stdout)
    assert len(sections) == len(BROKEN), result.stdout
    for index, (device_class, _, check, fix) in enumerate(BROKEN):
        lines = sections[udid(device_class, index)]
        failing = [line for line in lines if line.startswith("✗")]
        assert any(line.startswith(f"✗ {check}:") for line in failing), (check, lines)
        assert any(line.startswith("fix:") and fix in line for line in lines), (fix, lines)
        if check not in ("paired and trusted", "screen unlocked"):  # these hide the others
            assert len(failing) == 1, lines
    assert "some devices are not ready" in result.stdout
    # without a user token the queue, and so the space the largest model needs, is unknown
    assert "? free space:" in result.stdout and "no user token" in result.stdout


def test_doctor_exits_0_when_every_device_is_ready(tmp_path: Path) -> None:
    result = doctor(tmp_path, ["iphone-16-pro", "iphone-17-pro"], ["0=ios=16.7.10"])

    assert result.returncode == 0, result.stdout + result.stderr
    assert "✗" not in result.stdout
    assert "(iOS 16.7.10)" in result.stdout and "(iOS 26.0.1)" in result.stdout
    assert "✓ tunnel: RemoteServiceDiscovery answers through tunneld" in result.stdout
    assert result.stdout.rstrip().endswith("all devices ready")


def help_of(*command: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "agent", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split())  # argparse wraps lines to the terminal's width


def test_each_command_of_the_agent_has_its_own_help() -> None:
    doctor_help = help_of("doctor")
    assert doctor_help.startswith("usage: python -m agent doctor ")
    assert "decodebench agent doctor: is every attached iPhone ready for runs" in doctor_help
    assert "--queue-token" in doctor_help and "--driver" in doctor_help
    assert "claims runs for its devices" not in doctor_help

    agent_help = help_of()
    assert agent_help.startswith("usage: python -m agent ")
    assert "decodebench device agent: claims runs for its devices" in agent_help
    assert "doctor" in agent_help and "--queue-token" not in agent_help
