"""Device profiles: the parameters of the roofline model of each iPhone class."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DeviceProfile(BaseModel):
    """A memory-bound decode model: seconds per token = bytes moved / effective bandwidth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_class: str
    display_name: str
    product_types: tuple[str, ...]
    effective_bandwidth_mb_s: float = Field(gt=0, description="Fitted effective bandwidth, MB/s")
    source: str = Field(description="Where the parameters come from")

    @property
    def effective_bandwidth_bytes_s(self) -> float:
        return self.effective_bandwidth_mb_s * 1_000_000

    def predicted_tok_s(self, bytes_per_token: int) -> float:
        if bytes_per_token <= 0:
            raise ValueError("bytes_per_token must be positive")
        return self.effective_bandwidth_bytes_s / bytes_per_token


# Starting points from field measurements: ~55,900 MB/s fitted on iPhone 17 Pro, and the same
# final build ran about 21% slower on iPhone 16 Pro (tok/s x 0.79). Calibration from measured
# runs replaces these per device class.
IPHONE_17_PRO = DeviceProfile(
    device_class="iphone-17-pro",
    display_name="iPhone 17 Pro",
    product_types=("iPhone18,1",),
    effective_bandwidth_mb_s=55_900.0,
    source="field figure (DESIGN §1), uncalibrated",
)
IPHONE_16_PRO = DeviceProfile(
    device_class="iphone-16-pro",
    display_name="iPhone 16 Pro",
    product_types=("iPhone17,1",),
    effective_bandwidth_mb_s=round(55_900.0 * 0.79, 1),
    source="iPhone 17 Pro figure x 0.79 (DESIGN §1), uncalibrated",
)

DEVICE_PROFILES: dict[str, DeviceProfile] = {
    profile.device_class: profile for profile in (IPHONE_16_PRO, IPHONE_17_PRO)
}


def get_profile(device_class: str) -> DeviceProfile:
    try:
        return DEVICE_PROFILES[device_class]
    except KeyError:
        known = ", ".join(sorted(DEVICE_PROFILES))
        raise KeyError(f"unknown device class {device_class!r}; known: {known}") from None
