"""This machine's memory, measured: the RSS high-water mark of a span, and STREAM bandwidth."""

from __future__ import annotations

import resource
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
STREAM_ELEMENTS = 8 * 1024 * 1024  # 32 MiB per fp32 array: far beyond any last-level cache
STREAM_REPEATS = 5


def reset_peak_rss() -> bool:
    """Restart the kernel's RSS high-water mark (VmHWM) at the current RSS; False if it cannot."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """The process's RSS high-water mark since the last :func:`reset_peak_rss`."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # since process start


class StreamBandwidth(BaseModel):
    """STREAM-style sustained bandwidth (bytes moved per second, best of the repeats)."""

    model_config = ConfigDict(frozen=True)

    copy_bytes_per_s: float = Field(gt=0, description="a[:] = b: 8 bytes moved per element")
    triad_bytes_per_s: float = Field(gt=0, description="a = b + s*c: 12 bytes per element")
    elements: int
    threads: int

    def text(self) -> str:
        return (
            f"STREAM copy {self.copy_bytes_per_s / 1e9:.2f} GB/s, triad "
            f"{self.triad_bytes_per_s / 1e9:.2f} GB/s ({self.threads} threads, "
            f"{self.elements * 4 >> 20} MiB arrays)"
        )


def stream_bandwidth(
    elements: int = STREAM_ELEMENTS, repeats: int = STREAM_REPEATS
) -> StreamBandwidth:
    """Copy and triad over fp32 arrays with PyTorch's threaded kernels (one pass each)."""
    import torch

    a = torch.zeros(elements)
    b = torch.ones(elements)
    c = torch.full((elements,), 2.0)
    best_copy = best_triad = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a.copy_(b)
        best_copy = min(best_copy, time.perf_counter() - started)
        started = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        best_triad = min(best_triad, time.perf_counter() - started)
    if float(a[-1]) != 7.0:
        raise RuntimeError("the STREAM triad computed a wrong value")
    return StreamBandwidth(
        copy_bytes_per_s=2 * 4 * elements / best_copy,
        triad_bytes_per_s=3 * 4 * elements / best_triad,
        elements=elements,
        threads=torch.get_num_threads(),
    )
