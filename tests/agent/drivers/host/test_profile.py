"""The host's measured memory figures and the step-time models fitted from them."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from agent.drivers.host.memory import peak_rss_bytes, reset_peak_rss, stream_bandwidth
from agent.drivers.host.profile import abs_errors, fit, predict


def test_the_peak_rss_is_the_high_water_mark_of_the_span() -> None:
    if not reset_peak_rss():
        pytest.skip("this kernel does not let a process reset its RSS high-water mark")
    before = peak_rss_bytes()
    # 64 MiB of fresh anonymous pages, each touched: a numpy array may be carved out of memory
    # the allocator already holds resident (a long test process's freed arrays), and then the
    # resident size need not grow at all.
    block = mmap.mmap(-1, 64 << 20)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    block.close()
    assert peak_rss_bytes() >= before + (60 << 20)


def test_stream_bandwidth_is_measured_and_positive() -> None:
    bandwidth = stream_bandwidth(elements=1 << 20, repeats=2)
    assert bandwidth.copy_bytes_per_s > 0 and bandwidth.triad_bytes_per_s > 0
    assert "STREAM copy" in bandwidth.text()


def test_a_fit_on_exact_data_recovers_its_overhead_and_scale() -> None:
    terms = [0.01, 0.02, 0.04]
    seconds = [0.005 + 2 * term for term in terms]
    model = fit("kernel_rates", terms, seconds, free_scale=True)
    assert model.overhead_s == pytest.approx(0.005) and model.scale == pytest.approx(2)
    assert abs_errors([predict(model, 0.08)], [0.165]) == [pytest.approx(0, abs=1e-9)]
    roofline = fit("roofline", terms, seconds, free_scale=False)
    assert roofline.scale == 1 and roofline.overhead_s == pytest.approx(np.mean(seconds) - 0.07 / 3)
