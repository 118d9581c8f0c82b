"""Health gates before a run, and the agent settings that choose drivers and thresholds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.config import parse_settings
from agent.health import DeviceHealth, HealthPolicy, gate
from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.protocol import DeviceInfo
from decodebench.contracts.results import ThermalState

POLICY = HealthPolicy(min_battery=20, cooldown_s=100, hold_s=10)


def device(**facts: object) -> DeviceInfo:
    base = {
        "udid": "00008150-0000000000000001",
        "device_class": "iphone-17-pro",
        "product_type": "iPhone18,1",
        "driver": "pymobiledevice3",
        "simulated": False,
    }
    return DeviceInfo.model_validate({**base, **facts})


def test_a_healthy_device_is_ready() -> None:
    assert gate(device(battery_level=80, charging=False), DeviceHealth(), POLICY).status == "ready"


def test_a_flat_battery_waits_unless_charging() -> None:
    flat = gate(device(battery_level=12, charging=False), DeviceHealth(), POLICY)
    assert (flat.status, flat.status_detail) == (DeviceStatus.low_battery, "12% and not charging")
    assert gate(device(battery_level=12, charging=True), DeviceHealth(), POLICY).status == "ready"


def test_a_hot_device_cools_down_for_the_policy_time() -> None:
    health = DeviceHealth()
    health.record_thermal(ThermalState.serious, now=1000.0)

    cooling = gate(device(), health, POLICY, now=1040.0)
    cooled = gate(device(), health, POLICY, now=1100.5)

    assert cooling.status == DeviceStatus.cooling
    assert cooling.status_detail == "thermal serious, 60 s left"
    assert cooling.thermal_state == ThermalState.serious
    assert (cooled.status, cooled.status_detail) == (DeviceStatus.ready, "")


def test_fair_is_warm_enough_to_run() -> None:
    health = DeviceHealth()
    health.record_thermal(ThermalState.fair, now=0.0)

    assert gate(device(), health, POLICY, now=1.0).status == "ready"


def test_a_device_failure_holds_the_device_with_doubling_holds() -> None:
    health = DeviceHealth()

    first = health.hold(DeviceStatus.locked, POLICY, now=0.0)
    assert gate(device(), health, POLICY, now=5.0).status == "locked"
    assert gate(device(), health, POLICY, now=10.5).status == "ready"  # the probe decides again
    second = health.hold(DeviceStatus.locked, POLICY, now=20.0)
    health.release()

    assert (first, second) == (10.0, 20.0)
    assert gate(device(), health, POLICY, now=21.0).status == "ready"


def test_driver_statuses_pass_through_the_gate() -> None:
    assert gate(device(status="developer mode off"), DeviceHealth(), POLICY).status == (
        "developer mode off"
    )


def test_driver_and_thresholds_come_from_flags_and_environment() -> None:
    environ = {
        "DECODEBENCH_AGENT_TOKEN": "t",
        "DECODEBENCH_AGENT_DRIVER": "emulated",
        "DECODEBENCH_AGENT_EMULATED_FAULTS": "0=app-crash;1=thermal=serious",
    }

    settings = parse_settings(
        ["--devices", "iphone-16-pro,iphone-17-pro", "--min-battery", "35", "--device-hold", "2"],
        environ,
    )

    assert settings.driver == "emulated"
    assert settings.simulated == ("iphone-16-pro", "iphone-17-pro")
    assert settings.emulated_faults == ("0=app-crash", "1=thermal=serious")
    assert (settings.min_battery, settings.device_hold_s) == (35, 2.0)


def test_the_pymobiledevice3_driver_needs_no_device_list() -> None:
    settings = parse_settings(
        ["--token", "t", "--driver", "pymobiledevice3", "--usbmux-address", "127.0.0.1:27015"], {}
    )

    assert settings.simulated == () and settings.usbmux_address == "127.0.0.1:27015"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--driver", "emulated"], "the emulated driver needs --simulated"),
        (["--devices", "iphone-17-pro", "--emulated-fault", "3=app-crash"], "names device 3"),
        (
            ["--devices", "iphone-17-pro", "--emulated-fault", "0=explode"],
            "unknown fault 'explode'",
        ),
        (["--driver", "telepathy"], "invalid choice: 'telepathy'"),
    ],
)
def test_bad_driver_settings_exit_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_settings(["--token", "t", *argv], {})

    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_a_status_outside_the_fixed_set_is_refused() -> None:
    """The particulars go in status_detail; the status itself is one of a fixed set."""
    with pytest.raises(ValidationError, match="status"):
        device(status="cooling: thermal serious, 40 s left")
