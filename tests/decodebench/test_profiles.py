"""Device profiles: the decode-speed model and the built-in starting points."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from decodebench.contracts.profiles import (
    DEVICE_PROFILES,
    IPHONE_15_PRO,
    IPHONE_16_PRO,
    IPHONE_17_PRO,
    DeviceProfile,
    UnknownDeviceClass,
    get_profile,
)


def profile(bandwidth_mb_s: float, overhead_us: float = 0.0) -> DeviceProfile:
    return DeviceProfile(
        device_class="test",
        display_name="Test",
        product_types=(),
        effective_bandwidth_mb_s=bandwidth_mb_s,
        dispatch_overhead_us=overhead_us,
        source="test",
    )


def test_three_pro_classes_start_from_the_field_figures() -> None:
    assert list(DEVICE_PROFILES) == ["iphone-15-pro", "iphone-16-pro", "iphone-17-pro", "host-cpu"]
    iphones = {name: p for name, p in DEVICE_PROFILES.items() if p.kind == "iphone"}
    assert list(iphones) == ["iphone-15-pro", "iphone-16-pro", "iphone-17-pro"]
    assert IPHONE_17_PRO.effective_bandwidth_mb_s == 55_900.0
    assert IPHONE_16_PRO.effective_bandwidth_mb_s == pytest.approx(55_900.0 * 0.79, abs=0.1)
    assert IPHONE_15_PRO.effective_bandwidth_mb_s == pytest.approx(55_900.0 * 0.79 / 1.17, abs=0.1)
    for built_in in DEVICE_PROFILES.values():
        # The field figure was a bandwidth-only fit: it already absorbs the dispatch cost.
        assert built_in.dispatch_overhead_us == 0.0
        assert not built_in.calibrated and built_in.calibration_runs == 0
        assert "uncalibrated" in built_in.source
    products = [product for p in iphones.values() for product in p.product_types]
    assert products == ["iPhone16,1", "iPhone17,1", "iPhone18,1"]
    assert DEVICE_PROFILES["host-cpu"].kind == "host"


def test_seconds_per_token_is_the_bandwidth_term_plus_the_dispatch_term() -> None:
    device = profile(1_000.0, overhead_us=10.0)  # 1 GB/s, 10 us per op
    assert device.seconds_per_token(2_000_000) == pytest.approx(0.002)
    assert device.seconds_per_token(2_000_000, dispatch_ops=100) == pytest.approx(0.003)
    assert device.predicted_tok_s(2_000_000, 100) == pytest.approx(1 / 0.003)
    # Callers that know only the bytes get the bandwidth term alone.
    assert IPHONE_17_PRO.predicted_tok_s(600_000) == pytest.approx(55_900e6 / 600_000)


def test_nonsense_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="bytes_per_token must be positive"):
        IPHONE_17_PRO.predicted_tok_s(0)
    with pytest.raises(ValueError, match="dispatch_ops must not be negative"):
        IPHONE_17_PRO.predicted_tok_s(1, -1)
    with pytest.raises(ValidationError):
        profile(0.0)
    with pytest.raises(ValidationError):
        profile(1.0, overhead_us=-1.0)
    with pytest.raises(UnknownDeviceClass, match="unknown device class 'iphone-3g'"):
        get_profile("iphone-3g")
