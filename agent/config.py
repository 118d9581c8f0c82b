"""Agent settings: command-line flags, falling back to DECODEBENCH_* environment variables."""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent.drivers.simulated import SimulatedDevice
from decodebench.profiles import DEVICE_PROFILES

ENV_PREFIX = "DECODEBENCH_"
DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
DEFAULT_WORK_DIR = Path.home() / ".cache" / "decodebench-agent"


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    server_url: str = DEFAULT_SERVER_URL
    token: str = Field(min_length=1, repr=False)
    name: str = Field(min_length=1, max_length=128)
    simulated: tuple[str, ...] = Field(
        default=(), description="Device classes, one simulated iPhone each"
    )
    work_dir: Path = DEFAULT_WORK_DIR
    poll_interval_s: float = Field(default=2.0, gt=0)
    heartbeat_interval_s: float | None = Field(
        default=None, gt=0, description="None: the interval the server asks for at registration"
    )
    time_scale: float = Field(default=0.0, ge=0, description="Sleep this fraction of sim time")
    run_timeout_s: float = Field(default=3600.0, gt=0)
    once: bool = Field(default=False, description="Exit once no device found work for idle_polls")
    idle_polls: int = Field(default=3, ge=1)
    max_idle_seconds: float | None = Field(default=None, gt=0)
    log_level: str = "INFO"

    @field_validator("simulated")
    @classmethod
    def _known_classes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for device_class in value:
            if device_class not in DEVICE_PROFILES:
                known = ", ".join(sorted(DEVICE_PROFILES))
                raise ValueError(f"unknown device class {device_class!r}; known: {known}")
        return value

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
        "--simulated",
        default=env("AGENT_SIMULATED", ""),
        metavar="CLASS[,CLASS…]",
        help="simulated iPhones, one per listed device class, e.g. iphone-16-pro,iphone-17-pro "
        "(env AGENT_SIMULATED)",
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
    if not simulated:
        parser.error(
            "no devices: pass --simulated with device classes, e.g. "
            f"--simulated {','.join(sorted(DEVICE_PROFILES))}"
        )
    try:
        return AgentSettings(
            server_url=args.server_url,
            token=args.token,
            name=args.name,
            simulated=simulated,
            work_dir=args.work_dir,
            poll_interval_s=args.poll_interval,
            heartbeat_interval_s=args.heartbeat_interval,
            time_scale=args.time_scale,
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
