"""Device profiles: the parameters of the decode-speed model of each iPhone class.

Decode is memory-bound, so one token costs the time to move its bytes plus a fixed cost per
dispatched op::

    seconds_per_token = bytes_moved_per_token / effective_bandwidth + dispatch_ops * overhead

The built-in profiles below are starting points; :mod:`decodebench.calibration` fits both
parameters of a device class from its measured runs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

BANDWIDTH = "effective_bandwidth_mb_s"
OVERHEAD = "dispatch_overhead_us"


THERMAL_STATES = ("nominal", "fair", "serious", "critical")


class DeviceNoise(BaseModel):
    """How a stand-in device (simulated, emulated) of this class jitters; see docs/noise-model.md.

    Every figure is a relative standard deviation or a rate; `noise_scale` (agent or sweep
    option) multiplies the spreads, slow-downs and the outlier rate, 0 turning all noise off.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_jitter: float = Field(
        default=0.03, ge=0, le=0.5, description="Per-token latency, log-normal sigma"
    )
    run_spread: float = Field(
        default=0.01, ge=0, le=0.5, description="Per-run latency offset on one device, sigma"
    )
    device_spread: float = Field(
        default=0.02, ge=0, le=0.5, description="Per-device latency offset (by UDID), sigma"
    )
    thermal_slowdown: dict[str, float] = Field(
        default_factory=lambda: {"nominal": 0.01, "fair": 0.04, "serious": 0.12, "critical": 0.3},
        description="Latency growth approached after sustained decode, per thermal state",
    )
    thermal_time_constant_s: float = Field(
        default=300.0, gt=0, description="Seconds of sustained work to reach 63% of it"
    )
    outlier_rate: float = Field(
        default=0.001, ge=0, le=0.1, description="Share of tokens that hit a stall"
    )
    outlier_factor: tuple[float, float] = Field(
        default=(5.0, 20.0), description="A stalled token takes this many times longer (uniform)"
    )
    source: str = Field(
        default="chosen assumptions, documented in docs/noise-model.md",
        description="Where the figures come from",
    )

    @field_validator("thermal_slowdown")
    @classmethod
    def _every_state(cls, value: dict[str, float]) -> dict[str, float]:
        missing = [state for state in THERMAL_STATES if state not in value]
        if missing:
            raise ValueError(f"thermal_slowdown lacks {', '.join(missing)}")
        if any(not 0 <= factor <= 2 for factor in value.values()):
            raise ValueError("thermal_slowdown values must be in [0, 2]")
        return value

    @field_validator("outlier_factor")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not 1 <= value[0] <= value[1]:
            raise ValueError("outlier_factor must be (low, high) with 1 <= low <= high")
        return value

    def slowdown(self, thermal_state: str) -> float:
        # An unknown thermal state is treated as nominal: the stand-in devices report one.
        return self.thermal_slowdown.get(thermal_state, self.thermal_slowdown["nominal"])


class DeviceProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device_class: str
    display_name: str
    product_types: tuple[str, ...]
    effective_bandwidth_mb_s: float = Field(gt=0, description="Effective bandwidth, MB/s")
    dispatch_overhead_us: float = Field(
        default=0.0, ge=0, description="Fixed cost of each dispatched op, microseconds"
    )
    source: str = Field(description="Where the parameters come from")
    kind: Literal["iphone", "host"] = Field(
        default="iphone", description="An iPhone class, or an agent host measured on its own CPU"
    )
    calibrated_parameters: tuple[str, ...] = Field(
        default=(), description="Parameters fitted from measured runs; the others are priors"
    )
    calibration_runs: int = Field(default=0, ge=0, description="Runs the fit used")
    calibration_builds: int = Field(default=0, ge=0, description="Distinct builds among them")
    noise: DeviceNoise = Field(
        default_factory=DeviceNoise, description="Noise of the simulated/emulated stand-in"
    )

    @property
    def effective_bandwidth_bytes_s(self) -> float:
        return self.effective_bandwidth_mb_s * 1_000_000

    @property
    def dispatch_overhead_s(self) -> float:
        return self.dispatch_overhead_us / 1_000_000

    @property
    def calibrated(self) -> bool:
        return bool(self.calibrated_parameters)

    def seconds_per_token(self, bytes_per_token: int, dispatch_ops: int = 0) -> float:
        if bytes_per_token <= 0:
            raise ValueError("bytes_per_token must be positive")
        if dispatch_ops < 0:
            raise ValueError("dispatch_ops must not be negative")
        bandwidth_term = bytes_per_token / self.effective_bandwidth_bytes_s
        return bandwidth_term + dispatch_ops * self.dispatch_overhead_s

    def predicted_tok_s(self, bytes_per_token: int, dispatch_ops: int = 0) -> float:
        return 1.0 / self.seconds_per_token(bytes_per_token, dispatch_ops)


# Starting points (sources: docs/device-profiles.md). The field fit (~55,900 MB/s on iPhone 17
# Pro) was bandwidth only, so the dispatch overhead it implies is 0: the fitted bandwidth
# already absorbs it. iPhone 16
# Pro ran the same final build about 21% slower (tok/s x 0.79). For iPhone 15 Pro there is no
# field figure: Apple states A18 Pro has 17% more memory bandwidth than A17 Pro, so it starts
# at the 16 Pro figure / 1.17. Calibration replaces each of these from measured runs.
IPHONE_17_PRO = DeviceProfile(
    device_class="iphone-17-pro",
    display_name="iPhone 17 Pro",
    product_types=("iPhone18,1",),
    effective_bandwidth_mb_s=55_900.0,
    source="field figure (docs/device-profiles.md), uncalibrated",
)
IPHONE_16_PRO = DeviceProfile(
    device_class="iphone-16-pro",
    display_name="iPhone 16 Pro",
    product_types=("iPhone17,1",),
    effective_bandwidth_mb_s=round(55_900.0 * 0.79, 1),
    source="iPhone 17 Pro figure x 0.79 (docs/device-profiles.md), uncalibrated",
)
IPHONE_15_PRO = DeviceProfile(
    device_class="iphone-15-pro",
    display_name="iPhone 15 Pro",
    product_types=("iPhone16,1",),
    effective_bandwidth_mb_s=round(55_900.0 * 0.79 / 1.17, 1),
    source="iPhone 16 Pro figure / 1.17 (A18 Pro's stated memory-bandwidth gain), uncalibrated",
)

# The host driver times the PyTorch reference on the agent host's own CPU: a real measurement,
# but not of an iPhone. Its prior is a typical desktop figure; calibration replaces it.
HOST_CPU = DeviceProfile(
    device_class="host-cpu",
    display_name="Host CPU (PyTorch reference)",
    product_types=("host-x86_64", "host-aarch64", "host-arm64"),
    effective_bandwidth_mb_s=10_000.0,
    source="typical host memory bandwidth, uncalibrated; measured on the agent host, not an iPhone",
    kind="host",
)

DEVICE_PROFILES: dict[str, DeviceProfile] = {
    profile.device_class: profile
    for profile in (IPHONE_15_PRO, IPHONE_16_PRO, IPHONE_17_PRO, HOST_CPU)
}


class UnknownDeviceClass(ValueError, LookupError):
    """A device class no profile describes; the message lists the known ones.

    A ``ValueError`` so that pydantic validators report it as the field's error as it is.
    """

    def __init__(self, device_class: str) -> None:
        known = ", ".join(sorted(DEVICE_PROFILES))
        super().__init__(f"unknown device class {device_class!r}; known: {known}")

    def __str__(self) -> str:
        return str(self.args[0])


def get_profile(device_class: str) -> DeviceProfile:
    """The one lookup of a device class's built-in profile."""
    try:
        return DEVICE_PROFILES[device_class]
    except KeyError:
        raise UnknownDeviceClass(device_class) from None


def known_device_classes(device_classes: list[str]) -> list[str]:
    """A request's device classes: each known (UnknownDeviceClass names one that is not), none
    twice."""
    for device_class in device_classes:
        get_profile(device_class)
    if len(set(device_classes)) != len(device_classes):
        raise ValueError("device classes must be distinct")
    return device_classes
