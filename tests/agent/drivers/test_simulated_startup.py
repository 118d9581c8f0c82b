"""The agent's settings with simulated devices, and its start-up against an unreachable
server (the loop against a real server is covered by the end-to-end test)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agent.config import AgentSettings, parse_settings, simulated_udid
from agent.drivers.simulated import SimulatedDriver
from agent.main import (
    Agent,
    RegistrationRefused,
    ServerUnreachable,
    is_transient,
    register_with_backoff,
)
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.protocol import AgentRegistration


def test_simulated_udids_are_stable_distinct_and_marked() -> None:
    settings = AgentSettings(
        token="t", name="lab-1", simulated=("iphone-16-pro", "iphone-17-pro", "iphone-17-pro")
    )

    udids = [device.udid for device in settings.simulated_devices()]

    assert udids == [device.udid for device in settings.simulated_devices()]
    assert len(set(udids)) == 3
    assert all(udid.startswith("sim-") for udid in udids)
    assert udids[0] == simulated_udid("lab-1", 0, "iphone-16-pro")
    assert simulated_udid("lab-2", 0, "iphone-16-pro") != udids[0]


def test_settings_come_from_the_environment_and_flags_override() -> None:
    environ = {
        "DECODEBENCH_SERVER_URL": "http://server:9000",
        "DECODEBENCH_AGENT_TOKEN": "secret",
        "DECODEBENCH_AGENT_NAME": "lab-7",
        "DECODEBENCH_AGENT_SIMULATED": "iphone-16-pro, iphone-17-pro",
        "DECODEBENCH_AGENT_POLL_INTERVAL_S": "0.5",
    }

    settings = parse_settings(["--poll-interval", "0.25", "--once"], environ)

    assert settings.server_url == "http://server:9000"
    assert settings.api_token == "secret"
    assert settings.name == "lab-7"
    assert settings.simulated == ("iphone-16-pro", "iphone-17-pro")
    assert settings.poll_interval_s == 0.25
    assert settings.once is True
    assert "secret" not in repr(settings)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--simulated", "iphone-17-pro"], "agent token is required"),
        (["--token", "t"], "no devices"),
        (["--token", "t", "--simulated", "pixel-9"], "unknown device class 'pixel-9'"),
        (["--token", "t", "--simulated", "iphone-17-pro", "--poll-interval", "0"], "poll_interval"),
    ],
)
def test_bad_settings_exit_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_settings(argv, {})

    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def unreachable_client() -> DecodebenchClient:
    # Port 9 (discard) on localhost: nothing listens, so connections are refused at once.
    return DecodebenchClient("http://127.0.0.1:9", token="t", timeout=2)


def test_registration_backs_off_then_gives_up_when_the_server_is_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registration = AgentRegistration(name="lab-1")
    started = time.monotonic()

    with unreachable_client() as client, pytest.raises(ServerUnreachable, match="unreachable"):
        register_with_backoff(
            client, registration, threading.Event(), give_up_after_s=1.0, first_delay_s=0.1
        )

    # Delays 0.1, 0.2, 0.4: three logged failures, then giving up before exceeding 1 s.
    failures = [r for r in caplog.records if "registration attempt" in r.getMessage()]
    assert [r.getMessage().split()[2] for r in failures] == ["1", "2", "3"]
    assert time.monotonic() - started < 1.5


def test_registration_stops_waiting_when_asked_to(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()

    with unreachable_client() as client:
        registered = register_with_backoff(client, AgentRegistration(name="lab-1"), stop)

    assert registered is None


def test_a_refusal_is_not_retried() -> None:
    # A refusal needs a live server answering 4xx (the end-to-end test); this checks the
    # classification the back-off loop relies on.
    assert not is_transient(ApiError(401, "bad token"))
    assert not is_transient(ApiError(422, "bad inventory"))
    assert is_transient(ApiError(503, "starting"))
    assert issubclass(RegistrationRefused, Exception)


def test_the_agent_exits_when_the_server_stays_unreachable(tmp_path: Path) -> None:
    settings = AgentSettings(
        token="t",
        name="lab-1",
        simulated=("iphone-17-pro",),
        work_dir=tmp_path,
        max_idle_seconds=0.5,
    )
    driver = SimulatedDriver(settings.simulated_devices(), tmp_path)

    with unreachable_client() as client:
        assert Agent(settings, client, driver).run() == 1
