"""Device profiles: the parameters of the decode-speed model of each iPhone class.

Decode is memory-bound, so one token costs the time to move its bytes plus a fixed cost per
dispatched op::

    seconds_per_token = bytes_moved_per_token / effective_bandwidth + dispatch_ops * overhead

The built-in profiles below are starting points; :mod:`decodebench.calibration` fits both
parameters of a device class from its measured runs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BANDWIDTH = "effective_bandwidth_mb_s"
OVERHEAD = "dispatch_overhead_us"
PARAMETERS = (BANDWIDTH, OVERHEAD)


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
