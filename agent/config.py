"""Agent settings: one pydantic-settings class; every flag of `python -m agent` is one of its
fields, falling back to a ``DECODEBENCH_AGENT_*`` environment variable, then to the field's
default. The parser is generated from the class, so a default or a range is written once.

Drivers (`--driver`): `simulated` (a formula per device class, no devices), `emulated` (an
in-process fake usbmuxd with emulated iPhones, driven through the real pymobiledevice3 path),
`pymobiledevice3` (the iPhones usbmuxd sees), `host` (the PyTorch reference on this CPU).
"""

from __future__ import annotations

import argparse
import contextvars
import hashlib
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from agent.drivers.simulated import SimulatedDevice
from agent.health import HealthPolicy
from decodebench.contracts.names import Driver
from decodebench.contracts.profiles import DEVICE_PROFILES, get_profile
from decodebench.contracts.protocol import MAX_CLAIM_WAIT_S
from decodebench.harness import HARNESS_BUNDLE_ID

ENV_PREFIX = "DECODEBENCH_AGENT_"
DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
DEFAULT_WORK_DIR = Path.home() / ".cache" / "decodebench-agent"

# The environment parse_settings reads (tests hand one in; the process uses os.environ).
_ENVIRON: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "agent_environ", default=None
)


def _items(separator: str):  # noqa: ANN202 (a validator factory)
    def split(value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(separator) if part.strip())
        return value

    return split


class _Environment(EnvSettingsSource):
    """The environment source, reading the mapping parse_settings was given."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        return parse_env_vars(
            os.environ if environ is None else environ,
            self.case_sensitive,
            self.env_ignore_empty,
            self.env_parse_none_str,
        )


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, populate_by_name=True
    )

    server_url: str = Field(
        default=DEFAULT_SERVER_URL,
        validation_alias=AliasChoices("server_url", "DECODEBENCH_SERVER_URL"),
        description="the decodebench server (env DECODEBENCH_SERVER_URL)",
    )
    token: SecretStr = Field(
        default=SecretStr(""), description="an agent token (env DECODEBENCH_AGENT_TOKEN, preferred)"
    )
    name: str = Field(
        default_factory=socket.gethostname, min_length=1, max_length=128, description="this host"
    )
    driver: Driver = Field(default=Driver.simulated, description="how devices are driven")
    simulated: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="simulated or emulated iPhones, one per listed device class, e.g. "
        "iphone-16-pro,iphone-17-pro",
    )
    emulated_faults: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="arm a fault or condition on emulated device INDEX, e.g. 0=disconnect-mid-push, "
        "1=app-crash:2, 0=locked, 1=thermal=serious (repeatable; ';'-separated in the environment)",
    )
    emulated_tokens: Literal["auto", "torch", "mil", "off"] = Field(
        default="auto",
        description="where the emulated harness gets greedy tokens: mil (the pushed package in the "
        "MIL reference interpreter: faithful, slow), torch (the PyTorch reference rebuilt from the "
        "preset), off, auto (mil for packages up to 32 MiB, else none)",
    )
    usbmux_address: str | None = Field(
        default=None,
        validation_alias=AliasChoices("usbmux_address", "DECODEBENCH_USBMUXD_ADDRESS"),
        description="usbmuxd as HOST:PORT or socket path (default: the system one)",
    )
    harness_ipa: Path | None = Field(default=None, description="installed when missing")
    harness_bundle_id: str = Field(
        default=HARNESS_BUNDLE_ID,
        pattern=r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$",
        description="the bundle identifier the harness was signed with (each team renames it)",
    )
    tunneld_address: str | None = Field(default=None, description="HOST:PORT of tunneld (iOS 17+)")
    ddi_folder: Path | None = Field(
        default=None,
        description="developer disk images: DeviceSupport/<version>/ (iOS < 17), Personalized/ "
        "(17+); never downloaded (see agent/README.md)",
    )
    host_device_class: str = Field(default="host-cpu", description="device class of the host")
    host_threads: int | None = Field(default=None, ge=1, description="torch threads on the host")
    min_battery: int = Field(
        default=20, ge=0, le=100, description="percent; ignored while charging"
    )
    cooldown_s: float = Field(default=120.0, ge=0, description="rest after a run ended hot")
    health_interval_s: float = Field(
        default=10.0, gt=0, description="seconds between health probes of a ready device"
    )
    device_hold_s: float = Field(
        default=15.0,
        gt=0,
        description="seconds a device rests after failing a run (locked, unplugged …); doubles",
    )
    work_dir: Path = Field(default=DEFAULT_WORK_DIR, description="artifacts and logs")
    poll_interval_s: float = Field(
        default=2.0, gt=0, description="seconds between claims when not long-polling"
    )
    claim_wait_s: int = Field(
        default=50,
        ge=0,
        le=MAX_CLAIM_WAIT_S,
        description="an idle device's claim waits up to this long on the server, answered as "
        "soon as a run is claimable (0: poll every --poll-interval; --once polls)",
    )
    heartbeat_interval_s: float | None = Field(
        default=None, gt=0, description="default: the interval the server asks for"
    )
    time_scale: float = Field(
        default=0.0,
        ge=0,
        description="simulated devices sleep this fraction of their simulated run time (0: none)",
    )
    noise_scale: float = Field(
        default=1.0,
        ge=0,
        le=10,
        description="scale the stand-in devices' timing noise (docs/noise-model.md); 0: none",
    )
    run_timeout_s: float = Field(default=3600.0, gt=0, description="longest a run may take")
    once: bool = Field(
        default=False,
        description="exit once no device has found a claimable run for --idle-polls polls in a row",
    )
    idle_polls: int = Field(default=3, ge=1, description="see --once")
    max_idle_seconds: float | None = Field(
        default=None, gt=0, description="exit after this long without any run in flight"
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING …")

    _split_devices = field_validator("simulated", mode="before")(_items(","))
    _split_faults = field_validator("emulated_faults", mode="before")(_items(";"))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _Environment(settings_cls)

    @field_validator("simulated")
    @classmethod
    def _known_classes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for device_class in value:
            get_profile(device_class)
        return value

    @field_validator("log_level")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.upper()

    @model_validator(mode="after")
    def _ready_to_run(self) -> AgentSettings:
        if not self.token.get_secret_value().strip():
            raise ValueError(f"an agent token is required: set {ENV_PREFIX}TOKEN or pass --token")
        if self.emulated_faults:
            from agent.drivers.faults_spec import check_fault_specs

            check_fault_specs(self.emulated_faults, len(self.simulated))
        return self

    @property
    def api_token(self) -> str:
        return self.token.get_secret_value()

    def health_policy(self) -> HealthPolicy:
        return HealthPolicy(
            min_battery=self.min_battery, cooldown_s=self.cooldown_s, hold_s=self.device_hold_s
        )

    def simulated_devices(self) -> list[SimulatedDevice]:
        return [
            SimulatedDevice(simulated_udid(self.name, index, device_class), device_class)
            for index, device_class in enumerate(self.simulated)
        ]


def simulated_udid(agent_name: str, index: int, device_class: str) -> str:
    """Stable across restarts, so the server sees the same device again; marked as simulated."""
    digest = hashlib.sha256(f"{agent_name}\0{index}\0{device_class}".encode()).hexdigest()
    return f"sim-{digest[:24]}"


# Flags whose spelling differs from their field's (kept so existing command lines still work).
FLAGS: dict[str, tuple[str, ...]] = {
    "simulated": ("--simulated", "--devices"),
    "emulated_faults": ("--emulated-fault",),
    "tunneld_address": ("--tunneld",),
    "cooldown_s": ("--cooldown",),
    "health_interval_s": ("--health-interval",),
    "device_hold_s": ("--device-hold",),
    "poll_interval_s": ("--poll-interval",),
    "claim_wait_s": ("--claim-wait",),
    "heartbeat_interval_s": ("--heartbeat-interval",),
    "run_timeout_s": ("--run-timeout",),
}


def _argument(
    name: str, field: FieldInfo, default: object
) -> tuple[tuple[str, ...], dict[str, Any]]:
    flags = FLAGS.get(name, ("--" + name.replace("_", "-"),))
    env = f"{ENV_PREFIX}{name.upper()}"
    if isinstance(field.validation_alias, AliasChoices):
        env = str(field.validation_alias.choices[-1])
    options: dict[str, Any] = {
        "dest": name,
        "default": default,
        "help": f"{field.description} (env {env})",
    }
    annotation = field.annotation
    kinds = [kind for kind in get_args(annotation) if kind is not type(None)] or [annotation]
    kind = kinds[0]
    if kind is bool:
        options["action"] = "store_true"
    elif name == "emulated_faults":
        options["action"] = "append"
    elif get_origin(kind) is Literal:
        options["choices"] = get_args(kind)
    elif isinstance(kind, type) and issubclass(kind, Driver):
        options["choices"] = [driver.value for driver in Driver]
    elif kind in (int, float, Path):
        options["type"] = kind
    return flags, options


def add_settings_arguments(parser: argparse.ArgumentParser, default: object = None) -> None:
    """A flag per setting; a flag not given is ``default`` (argparse.SUPPRESS: left out)."""
    for name, field in AgentSettings.model_fields.items():
        flags, options = _argument(name, field, default)
        parser.add_argument(*flags, **options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent",
        description="decodebench device agent: claims runs for its devices and uploads results.",
    )
    add_settings_arguments(parser)
    return parser


def parse_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> AgentSettings:
    """Flags, then the environment, then defaults; exits with status 2 and a message when invalid."""
    parser = build_parser()
    return settings_from(parser, parser.parse_args(argv), environ)


def settings_from(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
) -> AgentSettings:
    """The settings ``parser`` parsed into ``args``, then the environment, then defaults; exits
    with status 2 and ``parser``'s message when invalid."""
    # Flags not given stay out, so the environment and the defaults fill them (a store_true
    # flag not given is None too).
    given = {
        name: value
        for name in AgentSettings.model_fields
        if (value := getattr(args, name, None)) is not None
    }
    reset = _ENVIRON.set(environ)
    try:
        settings = AgentSettings(**given)
    except ValidationError as error:
        problems = "; ".join(
            "{}{}".format(
                ".".join(str(part) for part in item["loc"]) + ": " if item["loc"] else "",
                item["msg"].removeprefix("Value error, "),
            )
            for item in error.errors()
        )
        parser.error(problems)
    finally:
        _ENVIRON.reset(reset)
    if not settings.simulated and settings.driver.fake_device:
        # A fleet built in code (tests) passes its devices to the driver; the command line
        # names them with --simulated.
        parser.error(
            f"no devices: the {settings.driver.value} driver needs --simulated with device "
            f"classes, e.g. --simulated {','.join(sorted(DEVICE_PROFILES))}"
        )
    return settings
