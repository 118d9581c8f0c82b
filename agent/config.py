"""Agent settings: command-line flags, falling back to DECODEBENCH_* environment variables.

Drivers (`--driver`): `simulated` (a formula per device class, no devices), `emulated` (an
in-process fake usbmuxd with emulated iPhones, driven through the real pymobiledevice3 path),
`pymobiledevice3` (the iPhones usbmuxd sees), `host` (the PyTorch reference on this CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.drivers.simulated import SimulatedDevice
from decodebench.harness import HARNESS_BUNDLE_ID
from decodebench.profiles import DEVICE_PROFILES, get_profile

ENV_PREFIX = "DECODEBENCH_"
DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
DEFAULT_WORK_DIR = Path.home() / ".cache" / "decodebench-agent"
DRIVERS = ("simulated", "emulated", "pymobiledevice3", "host")
FAKE_DEVICE_DRIVERS = {"simulated", "emulated"}
Driver = Literal["simulated", "emulated", "pymobiledevice3", "host"]


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    server_url: str = DEFAULT_SERVER_URL
    token: str = Field(min_length=1, repr=False)
    name: str = Field(min_length=1, max_length=128)
    driver: Driver = "simulated"
    simulated: tuple[str, ...] = Field(
        default=(), description="Device classes, one simulated (or emulated) iPhone each"
    )
    emulated_faults: tuple[str, ...] = Field(
        default=(),
        description="INDEX=SPEC faults of emulated devices (decodebench.emulated.faults)",
    )
    emulated_tokens: Literal["auto", "torch", "mil", "off"] = "auto"
    usbmux_address: str | None = Field(default=None, description="HOST:PORT or socket path")
    harness_ipa: Path | None = None
    harness_bundle_id: str = Field(
        default=HARNESS_BUNDLE_ID,
        pattern=r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$",
        description="The harness app's bundle identifier (each signing team renames it)",
    )
    tunneld_address: str | None = Field(default=None, description="HOST:PORT of tunneld")
    ddi_folder: Path | None = Field(
        default=None, description="Developer disk images to mount from (see agent/README.md)"
    )
    host_device_class: str = "host-cpu"
    host_threads: int | None = Field(default=None, ge=1)
    min_battery: int = Field(default=20, ge=0, le=100)
    cooldown_s: float = Field(default=120.0, ge=0)
    health_interval_s: float = Field(default=10.0, gt=0)
    device_hold_s: float = Field(
        default=15.0, gt=0, description="First hold after a device failure; doubles each time"
    )
    work_dir: Path = DEFAULT_WORK_DIR
    poll_interval_s: float = Field(default=2.0, gt=0)
    heartbeat_interval_s: float | None = Field(
        default=None, gt=0, description="None: the interval the server asks for at registration"
    )
    time_scale: float = Field(default=0.0, ge=0, description="Sleep this fraction of sim time")
    noise_scale: float = Field(
        default=1.0, ge=0, le=10, description="Scale of simulated/emulated timing noise; 0: none"
    )
    run_timeout_s: float = Field(default=3600.0, gt=0)
    once: bool = Field(default=False, description="Exit once no device found work for idle_polls")
    idle_polls: int = Field(default=3, ge=1)
    max_idle_seconds: float | None = Field(default=None, gt=0)
    log_level: str = "INFO"

    @field_validator("simulated")
    @classmethod
    def _known_classes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for device_class in value:
            get_profile(device_class)
        return value

    @model_validator(mode="after")
    def _faults_name_devices(self) -> AgentSettings:
        if self.emulated_faults:
            from agent.drivers.faults_spec import check_fault_specs

            check_fault_specs(self.emulated_faults, len(self.simulated))
        return self

    def simulated_devices(self) -> list[SimulatedDevice]:
        return [
            SimulatedDevice(simulated_udid(self.name, index, device_class), device_class)
            for index, device_class in enumerate(self.simulated)
        ]


def simulated_udid(agent_name: str, index: int, device_class: str) -> str:
    """Stable across restarts, so the server sees the same device again; marked as simulated."""
    digest = hashlib.sha256(f"{agent_name}\0{index}\0{device_class}".encode()).hexdigest()
    return f"sim-{digest[:24]}"


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    def env(name: str, default: str | None = None) -> str | None:
        return environ.get(ENV_PREFIX + name, default)

    parser = argparse.ArgumentParser(
        prog="python -m agent",
        description="decodebench device agent: claims runs for its devices and uploads results.",
    )
    parser.add_argument(
        "--server-url", default=env("SERVER_URL", DEFAULT_SERVER_URL), help="env SERVER_URL"
    )
    parser.add_argument("--token", default=env("AGENT_TOKEN"), help="env AGENT_TOKEN (preferred)")
    parser.add_argument(
        "--name", default=env("AGENT_NAME", socket.gethostname()), help="env AGENT_NAME"
    )
    parser.add_argument(
        "--driver",
        choices=DRIVERS,
        default=env("AGENT_DRIVER", "simulated"),
        help="how devices are driven (env AGENT_DRIVER); default simulated",
    )
    parser.add_argument(
        "--simulated",
        "--devices",
        dest="simulated",
        default=env("AGENT_SIMULATED", ""),
        metavar="CLASS[,CLASS…]",
        help="simulated or emulated iPhones, one per listed device class, e.g. "
        "iphone-16-pro,iphone-17-pro (env AGENT_SIMULATED)",
    )
    parser.add_argument(
        "--emulated-fault",
        action="append",
        default=[part for part in (env("AGENT_EMULATED_FAULTS") or "").split(";") if part],
        metavar="INDEX=SPEC",
        help="arm a fault or condition on emulated device INDEX, e.g. 0=disconnect-mid-push, "
        "1=app-crash:2, 0=locked, 1=thermal=serious (repeatable; env AGENT_EMULATED_FAULTS, "
        "';'-separated)",
    )
    parser.add_argument(
        "--emulated-tokens",
        choices=("auto", "torch", "mil", "off"),
        default=env("AGENT_EMULATED_TOKENS", "auto"),
        help="where the emulated harness gets greedy tokens: mil (the pushed package in the MIL "
        "reference interpreter: faithful, slow), torch (the PyTorch reference rebuilt from the "
        "preset), off, auto (mil for packages up to 32 MiB, else none)",
    )
    parser.add_argument(
        "--usbmux-address",
        default=env("USBMUXD_ADDRESS"),
        help="usbmuxd as HOST:PORT or socket path (pymobiledevice3 driver; default: the system one)",
    )
    parser.add_argument(
        "--harness-ipa", type=Path, default=env("AGENT_HARNESS_IPA"), help="installed when missing"
    )
    parser.add_argument(
        "--harness-bundle-id",
        default=env("AGENT_HARNESS_BUNDLE_ID", HARNESS_BUNDLE_ID),
        help="bundle identifier the harness was signed with (env AGENT_HARNESS_BUNDLE_ID); "
        f"default {HARNESS_BUNDLE_ID}",
    )
    parser.add_argument(
        "--tunneld", default=env("AGENT_TUNNELD"), help="HOST:PORT of tunneld (iOS 17+)"
    )
    parser.add_argument(
        "--ddi-folder",
        type=Path,
        default=env("AGENT_DDI_FOLDER"),
        help="developer disk images: DeviceSupport/<version>/ (iOS < 17), Personalized/ (17+); "
        "never downloaded (env AGENT_DDI_FOLDER)",
    )
    parser.add_argument("--host-device-class", default=env("AGENT_HOST_DEVICE_CLASS", "host-cpu"))
    parser.add_argument("--host-threads", type=int, default=env("AGENT_HOST_THREADS"))
    parser.add_argument("--min-battery", type=int, default=env("AGENT_MIN_BATTERY", "20"))
    parser.add_argument("--cooldown", type=float, default=env("AGENT_COOLDOWN", "120"))
    parser.add_argument(
        "--health-interval",
        type=float,
        default=env("AGENT_HEALTH_INTERVAL", "10"),
        help="seconds between health probes of a ready device",
    )
    parser.add_argument(
        "--device-hold",
        type=float,
        default=env("AGENT_DEVICE_HOLD", "15"),
        help="seconds a device rests after failing a run (locked, unplugged …); doubles each time",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=env("AGENT_WORK_DIR", str(DEFAULT_WORK_DIR))
    )
    parser.add_argument("--poll-interval", type=float, default=env("AGENT_POLL_INTERVAL", "2.0"))
    parser.add_argument("--heartbeat-interval", type=float, default=env("AGENT_HEARTBEAT_INTERVAL"))
    parser.add_argument(
        "--time-scale",
        type=float,
        default=env("AGENT_TIME_SCALE", "0"),
        help="simulated devices sleep this fraction of their simulated run time (0: no sleep)",
    )
    parser.add_argument(
        "--noise-scale",
        type=float,
        default=env("AGENT_NOISE_SCALE", "1"),
        help="scale the stand-in devices' timing noise (docs/noise-model.md); 0: none",
    )
    parser.add_argument("--run-timeout", type=float, default=env("AGENT_RUN_TIMEOUT", "3600"))
    parser.add_argument(
        "--once",
        action="store_true",
        default=env("AGENT_ONCE", "") in {"1", "true", "yes"},
        help="exit once no device has found a claimable run for --idle-polls polls in a row",
    )
    parser.add_argument("--idle-polls", type=int, default=env("AGENT_IDLE_POLLS", "3"))
    parser.add_argument(
        "--max-idle-seconds",
        type=float,
        default=env("AGENT_MAX_IDLE_SECONDS"),
        help="exit after this long without any run in flight",
    )
    parser.add_argument("--log-level", default=env("AGENT_LOG_LEVEL", "INFO"))
    return parser


def parse_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> AgentSettings:
    """Settings from flags, then environment; exits with status 2 and a message when invalid."""
    parser = build_parser(os.environ if environ is None else environ)
    args = parser.parse_args(argv)
    if not args.token:
        parser.error(f"an agent token is required: set {ENV_PREFIX}AGENT_TOKEN or pass --token")
    simulated = tuple(part.strip() for part in args.simulated.split(",") if part.strip())
    if not simulated and args.driver in FAKE_DEVICE_DRIVERS:
        parser.error(
            f"no devices: the {args.driver} driver needs --simulated with device classes, e.g. "
            f"--simulated {','.join(sorted(DEVICE_PROFILES))}"
        )
    try:
        return AgentSettings(
            server_url=args.server_url,
            token=args.token,
            name=args.name,
            driver=args.driver,
            simulated=simulated,
            emulated_faults=tuple(args.emulated_fault),
            emulated_tokens=args.emulated_tokens,
            usbmux_address=args.usbmux_address,
            harness_ipa=args.harness_ipa,
            harness_bundle_id=args.harness_bundle_id,
            tunneld_address=args.tunneld,
            ddi_folder=args.ddi_folder,
            host_device_class=args.host_device_class,
            host_threads=args.host_threads,
            min_battery=args.min_battery,
            cooldown_s=args.cooldown,
            health_interval_s=args.health_interval,
            device_hold_s=args.device_hold,
            work_dir=args.work_dir,
            poll_interval_s=args.poll_interval,
            heartbeat_interval_s=args.heartbeat_interval,
            time_scale=args.time_scale,
            noise_scale=args.noise_scale,
            run_timeout_s=args.run_timeout,
            once=args.once,
            idle_polls=args.idle_polls,
            max_idle_seconds=args.max_idle_seconds,
            log_level=args.log_level.upper(),
        )
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
            for item in error.errors()
        )
        parser.error(problems)
